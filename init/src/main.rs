//! The node binary. Its role comes from argv[0] (`init`, or PID 1) or the first argument:
//! `agent`, `runtime`, `crashtest`, `version`. (Pod sandboxes run the runtime's own small pause
//! program, `runtime::pause`, not this binary.)

#![forbid(unsafe_code)]

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args();
    let argv0 = args.next().unwrap_or_default();
    let role = args.next();
    // PID 1 has no role argument (the kernel runs `/init`).
    if role.is_none() && (std::process::id() == 1 || argv0.rsplit('/').next() == Some("init")) {
        init::run_pid1();
    }
    // PID 1 starts services with its handled signals blocked; a role starts with none blocked.
    if let Err(e) = nix::sys::signal::SigSet::empty().thread_set_mask() {
        eprintln!("cannot reset the signal mask: {e}");
    }
    match role.as_deref() {
        Some("agent") => {
            init::log::install("agent", "info");
            init::sys::protect_from_oom();
            match agent::run(agent::AgentConfig::default()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %e, "agent failed");
                    ExitCode::FAILURE
                }
            }
        }
        Some("runtime") => {
            let console = init::sys::dup_cloexec(2, 100).ok();
            // libcgroups warns about rdma/misc on every create and libcontainer about seccomp (we
            // install it ourselves): noise, filtered; their errors still show.
            init::log::install_with_console(
                "runtime",
                "info,libcgroups=error,libcontainer::process::init::process=error",
                console,
            );
            init::sys::protect_from_oom();
            match runtime::server::serve(runtime::server::Options::default()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %e, "runtime failed");
                    ExitCode::FAILURE
                }
            }
        }
        Some("crashtest") => {
            // Supervision test service (machine config debug.crashService): crash after 200 ms.
            std::thread::sleep(std::time::Duration::from_millis(200));
            ExitCode::FAILURE
        }
        Some("version") => {
            println!("nodeos {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        other => {
            eprintln!("usage: nodeos agent|runtime|version (got {other:?}); as /init it is PID 1");
            ExitCode::from(2)
        }
    }
}
