//! Terminals and descriptors for exec sessions (`kubectl exec -t`): the client makes the stdio it
//! sends along with `Exec`.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

/// A pseudo-terminal pair: (master, slave).
pub fn openpty() -> io::Result<(OwnedFd, OwnedFd)> {
    let p = nix::pty::openpty(None, None).map_err(io::Error::from)?;
    Ok((p.master, p.slave))
}

/// Sets a terminal's window size.
pub fn set_window_size(fd: BorrowedFd<'_>, cols: u16, rows: u16) -> io::Result<()> {
    let ws = nix::pty::Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    crate::sys::set_window_size(fd, &ws)
}

/// Puts a descriptor in non-blocking mode (for async readers of pipes and terminals).
pub fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let flags = fcntl(fd.as_raw_fd(), FcntlArg::F_GETFL).map_err(io::Error::from)?;
    let flags = OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK;
    fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(flags))
        .map(drop)
        .map_err(io::Error::from)
}
