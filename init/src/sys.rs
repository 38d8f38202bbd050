//! Thin wrappers over the system calls PID 1 needs that `nix` does not cover: loading compressed
//! kernel modules, scheduling and descriptors. All of init's `unsafe` lives here.

use std::io;
use std::os::fd::AsRawFd;

/// `finit_module(2)` flag: the kernel decompresses the file itself (`CONFIG_MODULE_DECOMPRESS`).
const MODULE_INIT_COMPRESSED_FILE: libc::c_uint = 4;

/// Loads a kernel module from an open `.ko`/`.ko.xz` file.
pub fn finit_module(file: &std::fs::File, compressed: bool) -> io::Result<()> {
    let flags = if compressed {
        MODULE_INIT_COMPRESSED_FILE
    } else {
        0
    };
    let params = c"";
    // SAFETY: the fd is valid for the duration of the call (borrowed from `file`), `params` is a
    // NUL-terminated string that outlives the call, and the syscall does not retain either.
    let rc = unsafe { libc::syscall(libc::SYS_finit_module, file.as_raw_fd(), params.as_ptr(), flags) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Seconds and milliseconds since the kernel started (CLOCK_BOOTTIME).
pub fn boot_ms() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME) {
        Ok(ts) => (ts.tv_sec() as u64) * 1000 + (ts.tv_nsec() as u64) / 1_000_000,
        Err(_) => 0,
    }
}

/// Moves the calling thread to SCHED_IDLE: it runs only when nothing else wants the CPU. Used by
/// the background boot work (late modules, freeing the initramfs) so it does not slow the boot path.
pub fn make_thread_idle() -> io::Result<()> {
    // SAFETY: sched_param is a plain C struct of integers (musl adds reserved fields); all-zero
    // is valid and means priority 0, the only priority SCHED_IDLE accepts.
    let param: libc::sched_param = unsafe { std::mem::zeroed() };
    // SAFETY: `param` is a valid sched_param that outlives the call; pid 0 names the calling
    // thread on Linux, and the kernel only reads `param`.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A close-on-exec duplicate of `fd` numbered at least `min` (F_DUPFD_CLOEXEC).
pub fn dup_cloexec(fd: i32, min: i32) -> io::Result<std::fs::File> {
    use std::os::fd::FromRawFd;
    let new = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(min))?;
    // SAFETY: F_DUPFD_CLOEXEC returned a new descriptor that nothing else owns.
    Ok(unsafe { std::fs::File::from_raw_fd(new) })
}

/// Gives this process the node daemons' `oom_score_adj` ([`kcore::qos::NODE_DAEMON_OOM_SCORE_ADJ`]);
/// the agent and the runtime call it first thing. A failure is logged, not fatal.
pub fn protect_from_oom() {
    let adj = kcore::qos::NODE_DAEMON_OOM_SCORE_ADJ;
    match std::fs::write("/proc/self/oom_score_adj", adj.to_string()) {
        Ok(()) => tracing::info!(oom_score_adj = adj, "protected from the OOM killer"),
        Err(e) => tracing::warn!(error = %e, "cannot lower this daemon's oom_score_adj"),
    }
}
