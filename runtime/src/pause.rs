//! The pause role: the process that holds a pod sandbox's namespaces. It sleeps until SIGTERM or
//! SIGINT, and reaps zombies when it is PID 1 of a shared pid namespace.

use std::process::ExitCode;

use nix::sys::signal::{SigSet, Signal};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

/// Runs the pause loop; returns when asked to stop.
pub fn run() -> ExitCode {
    let mut set = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGCHLD] {
        set.add(s);
    }
    if set.thread_block().is_err() {
        return ExitCode::FAILURE;
    }
    loop {
        match set.wait() {
            Ok(Signal::SIGCHLD) => {
                while let Ok(status) = waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                    if status == WaitStatus::StillAlive {
                        break;
                    }
                }
            }
            Ok(_) => return ExitCode::SUCCESS,
            Err(_) => return ExitCode::FAILURE,
        }
    }
}
