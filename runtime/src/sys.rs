//! Thin wrappers over file-system calls the runtime needs. All of the runtime's `unsafe` lives
//! here.

use std::ffi::{CStr, CString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::sys::stat::{Mode, SFlag, UtimensatFlags, makedev, mknod, utimensat};
use nix::sys::time::TimeSpec;
use nix::unistd::{Gid, Uid, fchownat};

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))
}

/// `lsetxattr(2)`: sets an extended attribute on `path` itself (never through a symlink).
pub fn set_xattr(path: &Path, name: &CStr, value: &[u8]) -> io::Result<()> {
    let p = cpath(path)?;
    // SAFETY: `p` and `name` are NUL-terminated strings and `value` a valid buffer of the given
    // length; all outlive the call and the kernel does not keep them.
    let rc = unsafe { libc::lsetxattr(p.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// An overlayfs whiteout: a 0:0 character device.
pub fn mknod_whiteout(path: &Path) -> io::Result<()> {
    mknod(path, SFlag::S_IFCHR, Mode::empty(), makedev(0, 0)).map_err(io::Error::from)
}

pub fn mkfifo(path: &Path) -> io::Result<()> {
    nix::unistd::mkfifo(path, Mode::from_bits_truncate(0o644)).map_err(io::Error::from)
}

/// Sets the owner of `path` itself. Without CAP_CHOWN (unprivileged unit tests) ownership is left
/// as it is.
pub fn lchown(path: &Path, uid: u64, gid: u64) -> io::Result<()> {
    let (Ok(uid), Ok(gid)) = (u32::try_from(uid), u32::try_from(gid)) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "uid/gid out of range",
        ));
    };
    match fchownat(
        None,
        path,
        Some(Uid::from_raw(uid)),
        Some(Gid::from_raw(gid)),
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    ) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EPERM) if !nix::unistd::geteuid().is_root() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Sets the modification (and access) time of `path` itself.
pub fn set_mtime(path: &Path, secs: u64) -> io::Result<()> {
    let t = TimeSpec::new(i64::try_from(secs).unwrap_or(0), 0);
    utimensat(None, path, &t, &t, UtimensatFlags::NoFollowSymlink).map_err(io::Error::from)
}

/// `pidfd_open(2)`: a descriptor that becomes readable when the process exits (works for
/// processes that are not our children too).
pub fn pidfd_open(pid: i32) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: plain syscall with integer arguments; on success it returns a new descriptor that
    // this process owns.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor from pidfd_open, owned by nobody else.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

/// Takes ownership of descriptors the kernel just installed in this process (SCM_RIGHTS).
pub fn adopt_received(raw: Vec<i32>) -> Vec<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    raw.into_iter()
        // SAFETY: each descriptor was just received through SCM_RIGHTS; this process owns it and
        // nothing else refers to it.
        .map(|r| unsafe { std::os::fd::OwnedFd::from_raw_fd(r) })
        .collect()
}

/// Takes ownership of a descriptor this process inherited at exec for one purpose and was told
/// the number of (the fd store's, named by its environment variable); only ever called once per
/// descriptor, at start. None if `fd` is not open.
pub fn adopt_inherited(fd: i32) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFD).ok()?;
    // SAFETY: `fd` is open (checked above) and was passed to this process for this purpose
    // alone; nothing else in the process owns it or closes it.
    Some(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// `fork(2)`, for a helper child of the runtime process that runs Rust code of this process and
/// ends with `_exit`.
pub fn fork() -> io::Result<nix::unistd::ForkResult> {
    // SAFETY: the runtime process never starts a thread (`server`'s module doc), so no other
    // thread can hold the allocator's or any other lock at fork time: the child's copy of the
    // process is consistent, and the child only runs this process's code before `_exit`.
    unsafe { nix::unistd::fork() }.map_err(io::Error::from)
}

/// `_exit(2)`: ends a forked helper child without running the parent's exit handlers or
/// destructors (its copies of the parent's state are not its to clean up).
pub fn exit_child(code: i32) -> ! {
    // SAFETY: `_exit` takes an integer, never returns and touches no memory of this process.
    unsafe { libc::_exit(code) }
}

/// Runs a libcontainer build with this process's `oom_score_adj` set to `child` (None: left to
/// libcontainer) and puts the runtime's own score back afterwards.
///
/// libcontainer writes a new container's score into the *calling* process before it forks the
/// container (its `builder_impl`), and a process started in a running container (tenant
/// builder) inherits the caller's score. Without this the runtime (−999, the node daemons'
/// score) would take the score of the last container it created, 1000 for a BestEffort one,
/// and an exec would run at whatever that was instead of its container's score.
pub fn with_child_oom_score<T>(child: Option<i32>, build: impl FnOnce() -> T) -> T {
    const OWN: &str = "/proc/self/oom_score_adj";
    let own = std::fs::read_to_string(OWN).ok();
    if let Some(adj) = child
        && let Err(e) = std::fs::write(OWN, adj.to_string())
    {
        tracing::warn!(error = %e, adj, "cannot give the new process its oom_score_adj");
    }
    let out = build();
    if let Some(own) = own
        && let Err(e) = std::fs::write(OWN, own.trim())
    {
        tracing::warn!(error = %e, "cannot restore the runtime's oom_score_adj");
    }
    out
}

/// A process's `oom_score_adj`.
pub fn oom_score_adj(pid: i32) -> io::Result<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj"))?
        .trim()
        .parse()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "oom_score_adj is not a number"))
}

/// `syscall(2)` with two integer arguments, returning its errno (0 on success): the seccomp
/// probes make calls no safe wrapper exposes (x32 numbers, io_uring, calls refused on purpose).
pub fn syscall_errno(nr: i64, a: u64, b: u64) -> i32 {
    // SAFETY: the callers (the seccomp probes) pass integers, never addresses of this
    // process: where a call takes a pointer it gets 0 or u64::MAX, which the kernel refuses
    // (EFAULT) without touching memory, so no memory of this process is read or written.
    let rc = unsafe { libc::syscall(nr, a, b, 0u64, 0u64) };
    if rc == -1 {
        io::Error::last_os_error().raw_os_error().unwrap_or(-1)
    } else {
        0
    }
}

/// The descriptor numbers this process has open (`/proc/self/fd`, without the listing's own).
/// Only the numbers: what each one is gets read only for the few opened during a failed build
/// (a `readlink` per descriptor before every build cost ~150 calls per container on a node
/// with 30 pods).
fn open_fds() -> std::collections::BTreeSet<i32> {
    use nix::fcntl::OFlag;
    let Ok(mut dir) = nix::dir::Dir::open(
        "/proc/self/fd",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    ) else {
        return Default::default();
    };
    // The listing's own descriptor is closed afterwards and its number is the next one handed
    // out: it must not count as open, or a socket leaked there would never be closed.
    let own = std::os::fd::AsRawFd::as_raw_fd(&dir);
    dir.iter()
        .flatten()
        .filter_map(|e| e.file_name().to_str().ok()?.parse().ok())
        .filter(|fd| *fd != own)
        .collect()
}

fn is_socket(fd: i32) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{fd}"))
        .is_ok_and(|t| t.as_os_str().as_bytes().starts_with(b"socket:"))
}

/// Runs a libcontainer build; when it fails, closes the sockets it opened and left behind
/// ([`close_sockets_since`]). For the runtime's single thread only.
pub fn closing_sockets_on_failure<T, E>(build: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
    let before = open_fds();
    let built = build();
    if built.is_err() {
        let closed = close_sockets_since(&before);
        if closed > 0 {
            tracing::info!(closed, "closed the sockets of a failed libcontainer build");
        }
    }
    built
}

/// Closes the sockets among the descriptors opened since `before` was taken: what a failed
/// libcontainer build left open (its channels to the processes it started; measured: ~2
/// sockets per failed exec into a container that was exiting). Only for a single-threaded
/// caller, right after the failed build, when nothing else can have opened a socket meanwhile.
fn close_sockets_since(before: &std::collections::BTreeSet<i32>) -> usize {
    let mut closed = 0;
    for fd in open_fds().difference(before).filter(|fd| is_socket(**fd)) {
        // SAFETY: the descriptor was opened during the failed build by libcontainer, whose
        // objects for that build are all dropped; nothing in this process refers to it, so
        // closing it cannot close a descriptor someone else still uses.
        if unsafe { libc::close(*fd) } == 0 {
            closed += 1;
        }
    }
    closed
}
