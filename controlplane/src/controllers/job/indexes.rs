//! Sets of completion indexes in upstream's compressed form (`1,3-5,7`, `.status.completedIndexes`,
//! `.status.failedIndexes`, `successPolicy.rules[].succeededIndexes`): ordered, merged intervals.

use std::fmt;

/// Ordered, non-overlapping, non-adjacent intervals `[first, last]`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Intervals(Vec<(i32, i32)>);

impl Intervals {
    /// Parses `s` keeping indexes below `completions` (malformed parts are skipped, as upstream
    /// does with a corrupted status).
    pub fn parse(s: &str, completions: i32) -> Self {
        let mut out: Vec<(i32, i32)> = Vec::new();
        if s.is_empty() {
            return Self(out);
        }
        for part in s.split(',') {
            let mut bounds = part.splitn(2, '-');
            let Some(Ok(first)) = bounds.next().map(str::parse::<i32>) else {
                continue;
            };
            if first >= completions {
                break;
            }
            let last = match bounds.next() {
                Some(l) => match l.parse::<i32>() {
                    Ok(l) => l.min(completions - 1),
                    Err(_) => continue,
                },
                None => first,
            };
            match out.last_mut() {
                Some(prev) if prev.1 == first - 1 => prev.1 = last,
                _ => out.push((first, last)),
            }
        }
        Self(out)
    }

    /// The set plus `indexes` (in increasing order).
    pub fn with(&self, indexes: &[i32]) -> Self {
        self.merge(&Self(indexes.iter().map(|&i| (i, i)).collect()))
    }

    /// The union of both sets.
    pub fn merge(&self, other: &Self) -> Self {
        let mut all: Vec<(i32, i32)> = self.0.iter().chain(other.0.iter()).copied().collect();
        all.sort_unstable();
        let mut out: Vec<(i32, i32)> = Vec::with_capacity(all.len());
        for (first, last) in all {
            match out.last_mut() {
                Some(prev) if first <= prev.1.saturating_add(1) => prev.1 = prev.1.max(last),
                _ => out.push((first, last)),
            }
        }
        Self(out)
    }

    /// How many indexes the set holds.
    pub fn total(&self) -> i32 {
        self.0.iter().map(|(f, l)| l - f + 1).sum()
    }

    pub fn has(&self, ix: i32) -> bool {
        let pos = self.0.partition_point(|&(_, last)| last < ix);
        self.0.get(pos).is_some_and(|&(first, _)| first <= ix)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The intervals.
    pub fn intervals(&self) -> &[(i32, i32)] {
        &self.0
    }

    /// How many indexes of `self` are also in `other`.
    pub fn overlap(&self, other: &Self) -> i32 {
        let mut n = 0;
        for &(a, b) in &self.0 {
            for &(c, d) in &other.0 {
                let o = b.min(d) - a.max(c) + 1;
                if o > 0 {
                    n += o;
                }
            }
        }
        n
    }
}

/// Upstream's format: two adjacent indexes are `3,4`, three or more `3-5`.
impl fmt::Display for Intervals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (n, &(first, last)) in self.0.iter().enumerate() {
            if n > 0 {
                f.write_str(",")?;
            }
            write!(f, "{first}")?;
            if last == first + 1 {
                write!(f, ",{last}")?;
            } else if last > first {
                write!(f, "-{last}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_formats_and_merges_like_upstream() {
        let s = Intervals::parse("0,2-4,6,7", 10);
        assert_eq!(s.to_string(), "0,2-4,6,7");
        assert_eq!(s.total(), 6);
        assert!(s.has(3) && !s.has(5) && s.has(7));
        assert_eq!(s.with(&[1, 5]).to_string(), "0-7");
        assert_eq!(Intervals::parse("1-9", 5).to_string(), "1-4");
        assert_eq!(Intervals::parse("x,3", 5).to_string(), "3");
        assert_eq!(Intervals::default().with(&[1, 2]).to_string(), "1,2");
        assert_eq!(Intervals::parse("0-3", 8).overlap(&Intervals::parse("2-5", 8)), 2);
    }
}
