//! Restart back-off, keyed by pod and container (docs/SEEDS-SPEC.md NODE-18, the kubelet's
//! `flowcontrol.Backoff`): the first restart after a crash is immediate, then the container
//! waits 10 s, doubling to 300 s; a crash more than 10 minutes after the last restart starts
//! the sequence again. Failed starts (image pulls, NODE-58) use the same 10 s doubling to
//! 300 s between attempts.

use std::time::{Duration, SystemTime};

/// The first delay.
pub const INITIAL: Duration = Duration::from_secs(10);
/// The cap (`crashLoopBackOff.maxContainerRestartPeriod`, 5m0s by default).
pub const MAX: Duration = Duration::from_secs(300);
/// A crash this long after the last restart starts the sequence again (`HasExpiredFunc`).
pub const RESET: Duration = Duration::from_secs(600);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    delay: Duration,
    last: SystemTime,
}

/// One container's back-off.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backoff {
    entry: Option<Entry>,
}

impl Backoff {
    fn live(&self, at: SystemTime) -> Option<Entry> {
        self.entry
            .filter(|e| at.duration_since(e.last).unwrap_or_default() <= RESET)
    }

    /// When a container that exited at `finished` may be started again.
    pub fn restart_at(&self, finished: SystemTime) -> SystemTime {
        self.live(finished).map_or(finished, |e| finished + e.delay)
    }

    /// The delay in force for a container that exited at `finished` (the CrashLoopBackOff
    /// message shows it), zero when it restarts at once.
    pub fn delay(&self, finished: SystemTime) -> Duration {
        self.live(finished).map_or(Duration::ZERO, |e| e.delay)
    }

    /// Records a restart at `now` of a container that exited at `finished` (or a failed start,
    /// both `now`): the next delay doubles, or starts at [`INITIAL`] when the exit came more
    /// than [`RESET`] after the last restart (`flowcontrol.Backoff.Next`).
    pub fn step(&mut self, finished: SystemTime, now: SystemTime) {
        let delay = self.live(finished).map_or(INITIAL, |e| (e.delay * 2).min(MAX));
        self.entry = Some(Entry { delay, last: now });
    }

    /// When a failed start may be tried again: the last attempt plus the delay in force.
    pub fn retry_at(&self) -> Option<SystemTime> {
        self.entry.map(|e| e.last + e.delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kcore::time::go_duration;

    fn at(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + s)
    }

    #[test]
    fn crash_loop_delays_are_0_10_20_40_80_160_300_300() {
        let mut b = Backoff::default();
        let mut t = 0;
        let mut delays = Vec::new();
        for _ in 0..8 {
            // The container runs 1 s, then crashes; it restarts as soon as it may.
            let finished = at(t + 1);
            let restart = b.restart_at(finished);
            delays.push(restart.duration_since(finished).unwrap_or_default().as_secs());
            b.step(finished, restart);
            t = restart.duration_since(at(0)).unwrap_or_default().as_secs();
        }
        assert_eq!(delays, [0, 10, 20, 40, 80, 160, 300, 300]);
    }

    #[test]
    fn a_crash_more_than_ten_minutes_after_the_last_restart_restarts_at_once() {
        let table = [
            // (seconds between the last restart and the crash, expected delay)
            (599, 20),
            (600, 20),
            (601, 0),
            (1800, 0),
        ];
        for (gap, want) in table {
            let mut b = Backoff::default();
            b.step(at(0), at(0));
            b.step(at(4), at(5));
            let finished = at(5 + gap);
            assert_eq!(b.delay(finished).as_secs(), want, "gap {gap}");
            assert_eq!(
                b.restart_at(finished)
                    .duration_since(finished)
                    .unwrap_or_default()
                    .as_secs(),
                want,
                "gap {gap}"
            );
            let restarted = b.restart_at(finished);
            b.step(finished, restarted);
            let next = if want == 0 { 10 } else { 40 };
            assert_eq!(
                b.delay(restarted + Duration::from_secs(1)).as_secs(),
                next,
                "gap {gap}: next delay"
            );
        }
    }

    #[test]
    fn failed_starts_wait_10_s_doubling() {
        let mut b = Backoff::default();
        assert_eq!(b.retry_at(), None);
        b.step(at(0), at(0));
        assert_eq!(b.retry_at(), Some(at(10)));
        b.step(at(10), at(10));
        assert_eq!(b.retry_at(), Some(at(30)));
    }

    #[test]
    fn durations_print_as_go_does() {
        let table = [
            (0, "0s"),
            (10, "10s"),
            (80, "1m20s"),
            (160, "2m40s"),
            (300, "5m0s"),
            (3700, "1h1m40s"),
        ];
        for (s, want) in table {
            assert_eq!(go_duration(Duration::from_secs(s)), want);
        }
    }
}
