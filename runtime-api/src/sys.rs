//! The crate's `unsafe`: taking ownership of received descriptors and one terminal ioctl.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// Takes ownership of descriptors the kernel installed in this process (SCM_RIGHTS).
pub(crate) fn adopt_fds(raw: Vec<RawFd>) -> Vec<OwnedFd> {
    raw.into_iter()
        // SAFETY: each descriptor was just received through SCM_RIGHTS; this process owns it and
        // nothing else refers to it.
        .map(|r| unsafe { OwnedFd::from_raw_fd(r) })
        .collect()
}

nix::ioctl_write_ptr_bad!(tiocswinsz, nix::libc::TIOCSWINSZ, nix::pty::Winsize);

/// `TIOCSWINSZ` on a terminal.
pub(crate) fn set_window_size(fd: BorrowedFd<'_>, ws: &nix::pty::Winsize) -> io::Result<()> {
    // SAFETY: TIOCSWINSZ reads one Winsize from the pointer, which is valid for the call; `fd`
    // is a live descriptor borrowed for the call.
    unsafe { tiocswinsz(fd.as_raw_fd(), ws) }
        .map(drop)
        .map_err(io::Error::from)
}
