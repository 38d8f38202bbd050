//! Container logs in the CRI format (what `kubectl logs` reads through the kubelet):
//! `<RFC 3339 nano timestamp> <stdout|stderr> <F|P> <text>\n`, where `P` marks a partial line
//! (a line longer than the buffer, or output cut off without a newline) and `F` a full one.
//! Size-based rotation: when the file would pass `max_size` it is renamed to `<path>.1` (older
//! ones shift up, at most `max_files` files in total) and a new file is started.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Defaults of the kubelet's containerLogMaxSize / containerLogMaxFiles.
pub use runtime_api::{LOG_MAX_FILES as DEFAULT_MAX_FILES, LOG_MAX_SIZE as DEFAULT_MAX_SIZE};
/// Longest line kept whole; longer output is split into partial (`P`) records.
pub const MAX_LINE: usize = 16 * 1024;

/// Which stream a record came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// One container's log file.
#[derive(Debug)]
pub struct LogWriter {
    path: PathBuf,
    file: File,
    size: u64,
    max_size: u64,
    max_files: usize,
    /// Unterminated output per stream (stdout, stderr), waiting for its newline.
    pending: [Vec<u8>; 2],
}

/// Nanosecond RFC 3339 UTC timestamp of now.
pub fn timestamp() -> String {
    kcore::time::rfc3339_nanos(std::time::SystemTime::now())
}

impl LogWriter {
    pub fn open(path: &Path, max_size: u64, max_files: usize) -> io::Result<Self> {
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir)?;
        }
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let size = file.metadata()?.len();
        Ok(LogWriter {
            path: path.to_path_buf(),
            file,
            size,
            max_size,
            max_files: max_files.max(1),
            pending: [Vec::new(), Vec::new()],
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Size at which the file rotates, and how many files are kept.
    pub fn limits(&self) -> (u64, usize) {
        (self.max_size, self.max_files)
    }

    fn record(&mut self, stream: Stream, tag: char, text: &[u8]) -> io::Result<()> {
        let mut rec = format!("{} {} {tag} ", timestamp(), stream.name()).into_bytes();
        rec.extend_from_slice(text);
        rec.push(b'\n');
        if self.size > 0 && self.size + rec.len() as u64 > self.max_size {
            self.rotate()?;
        }
        self.file.write_all(&rec)?;
        self.size += rec.len() as u64;
        Ok(())
    }

    /// Appends raw output of one stream, writing every complete line.
    pub fn write(&mut self, stream: Stream, data: &[u8]) -> io::Result<()> {
        let idx = stream as usize;
        let mut buf = std::mem::take(&mut self.pending[idx]);
        buf.extend_from_slice(data);
        let mut start = 0;
        while let Some(nl) = buf[start..].iter().position(|b| *b == b'\n') {
            let line = buf[start..start + nl].to_vec();
            for (i, piece) in line.chunks(MAX_LINE).enumerate() {
                let last = (i + 1) * MAX_LINE >= line.len();
                self.record(stream, if last { 'F' } else { 'P' }, piece)?;
            }
            if line.is_empty() {
                self.record(stream, 'F', b"")?;
            }
            start += nl + 1;
        }
        let mut rest = buf.split_off(start);
        while rest.len() >= MAX_LINE {
            let tail = rest.split_off(MAX_LINE);
            self.record(stream, 'P', &rest)?;
            rest = tail;
        }
        self.pending[idx] = rest;
        Ok(())
    }

    /// Writes whatever is left without a newline (the stream closed) as partial records.
    pub fn flush_partial(&mut self) -> io::Result<()> {
        for (idx, stream) in [Stream::Stdout, Stream::Stderr].into_iter().enumerate() {
            let rest = std::mem::take(&mut self.pending[idx]);
            if !rest.is_empty() {
                self.record(stream, 'P', &rest)?;
            }
        }
        self.file.flush()
    }

    fn rotated(&self, n: usize) -> PathBuf {
        let mut p = self.path.clone().into_os_string();
        p.push(format!(".{n}"));
        PathBuf::from(p)
    }

    fn rotate(&mut self) -> io::Result<()> {
        // Keep max_files in total: the live file plus max_files - 1 rotated ones.
        let keep = self.max_files - 1;
        if keep == 0 {
            self.file.set_len(0)?;
            self.size = 0;
            return Ok(());
        }
        let _ = fs::remove_file(self.rotated(keep));
        for n in (1..keep).rev() {
            let _ = fs::rename(self.rotated(n), self.rotated(n + 1));
        }
        fs::rename(&self.path, self.rotated(1))?;
        self.file = OpenOptions::new().create(true).append(true).open(&self.path)?;
        self.size = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(p: &Path) -> Vec<String> {
        fs::read_to_string(p)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn writes_cri_records() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("app/0.log");
        let mut w = LogWriter::open(&path, DEFAULT_MAX_SIZE, DEFAULT_MAX_FILES).expect("open");
        w.write(Stream::Stdout, b"hello\nwor").expect("write");
        w.write(Stream::Stderr, b"oops\n").expect("write");
        w.write(Stream::Stdout, b"ld\n\n").expect("write");
        w.write(Stream::Stdout, b"no newline").expect("write");
        w.flush_partial().expect("flush");
        let l = lines(&path);
        let parts: Vec<Vec<&str>> = l.iter().map(|x| x.splitn(4, ' ').collect()).collect();
        assert_eq!(parts.len(), 5, "{l:?}");
        assert_eq!(parts[0][1..], ["stdout", "F", "hello"]);
        assert_eq!(parts[1][1..], ["stderr", "F", "oops"]);
        assert_eq!(parts[2][1..], ["stdout", "F", "world"]);
        assert_eq!(parts[3][1..], ["stdout", "F", ""]);
        assert_eq!(parts[4][1..], ["stdout", "P", "no newline"]);
        let ts = parts[0][0];
        assert!(
            ts.len() == 30 && ts.ends_with('Z') && ts.as_bytes()[10] == b'T',
            "{ts}"
        );
    }

    #[test]
    fn rotates_by_size_and_splits_long_lines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("0.log");
        let mut w = LogWriter::open(&path, 1000, 3).expect("open");
        for i in 0..100 {
            w.write(Stream::Stdout, format!("line {i:03}\n").as_bytes())
                .expect("write");
        }
        assert!(path.exists() && dir.path().join("0.log.1").exists() && dir.path().join("0.log.2").exists());
        assert!(!dir.path().join("0.log.3").exists(), "at most 3 files");
        for p in [path.clone(), dir.path().join("0.log.1")] {
            assert!(fs::metadata(&p).expect("meta").len() <= 1000);
        }
        assert!(lines(&path).last().expect("last").ends_with("line 099"));
        let mut w = LogWriter::open(&dir.path().join("long.log"), DEFAULT_MAX_SIZE, 2).expect("open");
        w.write(Stream::Stdout, &vec![b'x'; MAX_LINE * 2 + 5])
            .expect("write");
        w.write(Stream::Stdout, b"\n").expect("write");
        let l = lines(&dir.path().join("long.log"));
        let tags: Vec<&str> = l.iter().map(|x| x.split(' ').nth(2).unwrap_or("")).collect();
        assert_eq!(tags, ["P", "P", "F"]);
    }
}
