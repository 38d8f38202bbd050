//! Exit statuses of the runtime's processes that PID 1 reaped.
//!
//! The runtime is the parent of its containers and pause processes, so it reaps them and knows
//! their exit codes. When the runtime itself is restarted, the running ones are re-parented to
//! PID 1 and re-adopted through pidfds ([`super::state`]), but a pidfd tells only *that* a
//! process that is not one's child ended, not how: PID 1 reaps it. So PID 1 records every
//! orphan it reaps as `<pid> <start time> <exit code> <signal or ->` lines in [`PATH`] (on
//! `/run`), reading the start time while the process is still a zombie (`waitid` with
//! `WNOWAIT`), and the runtime looks a re-adopted container's exit up by pid and start time,
//! which together name one process. The file keeps its last 32 KiB once it grows past 64 KiB.

use std::fs;
use std::io::{self, Write};
use std::path::Path;

/// Where PID 1 records the orphans it reaped.
pub const PATH: &str = "/run/nodeos/orphan-exits";

/// Size past which the file is cut to its last [`KEEP`] bytes.
const LIMIT: u64 = 64 * 1024;
const KEEP: usize = 32 * 1024;

/// Exit code and signal of a process that ended.
pub fn exit_of(status: nix::sys::wait::WaitStatus) -> Option<(i32, Option<i32>)> {
    use nix::sys::wait::WaitStatus;
    match status {
        WaitStatus::Exited(_, code) => Some((code, None)),
        WaitStatus::Signaled(_, sig, _) => Some((128 + sig as i32, Some(sig as i32))),
        _ => None,
    }
}

/// Field 22 of /proc/<pid>/stat (start time in clock ticks since boot); a zombie has it too.
pub fn start_time(pid: i32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: count from the last ')'.
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

/// Appends one reaped orphan's exit: its code (128 + signal for a signal) and signal.
pub fn record(path: &Path, pid: i32, start_time: u64, code: i32, signal: Option<i32>) -> io::Result<()> {
    if fs::metadata(path).is_ok_and(|m| m.len() > LIMIT) {
        let all = fs::read(path)?;
        let cut = all.len().saturating_sub(KEEP);
        // From the first whole line after the cut.
        let start = all[cut..]
            .iter()
            .position(|b| *b == b'\n')
            .map_or(all.len(), |i| cut + i + 1);
        fs::write(path, &all[start..])?;
    }
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    let signal = signal.map_or("-".to_string(), |s| s.to_string());
    let mut f = fs::OpenOptions::new().create(true).append(true).open(path)?;
    f.write_all(format!("{pid} {start_time} {code} {signal}\n").as_bytes())
}

/// The exit PID 1 recorded for process `pid` started at `start_time`: code and signal.
pub fn lookup(path: &Path, pid: i32, start_time: u64) -> Option<(i32, Option<i32>)> {
    let text = fs::read_to_string(path).ok()?;
    text.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let [p, t, code, signal] = f[..] else { return None };
        (p.parse() == Ok(pid) && t.parse() == Ok(start_time)).then_some(())?;
        Some((code.parse().ok()?, signal.parse().ok()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exits_are_found_by_pid_and_start_time() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("nodeos/orphan-exits");
        assert_eq!(lookup(&path, 10, 5), None, "no file yet");
        record(&path, 10, 5, 0, None).expect("record");
        record(&path, 11, 6, 137, Some(9)).expect("record");
        // The same pid, used again by a later process.
        record(&path, 10, 900, 3, None).expect("record");
        assert_eq!(lookup(&path, 10, 5), Some((0, None)));
        assert_eq!(lookup(&path, 11, 6), Some((137, Some(9))));
        assert_eq!(lookup(&path, 10, 900), Some((3, None)));
        assert_eq!(lookup(&path, 10, 6), None, "another process with that pid");
        assert_eq!(start_time(std::process::id() as i32).map(|t| t > 0), Some(true));
    }

    #[test]
    fn the_file_keeps_its_last_lines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("orphan-exits");
        for i in 0..10_000 {
            record(&path, i, 1, 0, None).expect("record");
        }
        let len = fs::metadata(&path).expect("file").len();
        assert!(len <= LIMIT + 32, "{len} bytes");
        assert_eq!(lookup(&path, 9_999, 1), Some((0, None)), "the newest kept");
        assert_eq!(lookup(&path, 0, 1), None, "the oldest dropped");
        let text = fs::read_to_string(&path).expect("text");
        assert!(
            text.lines().all(|l| l.split(' ').count() == 4),
            "whole lines only"
        );
    }
}
