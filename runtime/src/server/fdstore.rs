//! Container stdio kept across runtime restarts.
//!
//! The runtime is the only reader of its containers' output pipes and the only holder of their
//! stdin pipes' write ends and terminal masters. With no shim per container, a restarted runtime
//! used to find them closed: the container's next write to stdout failed with EPIPE (or SIGPIPE
//! killed it), a terminal hung up (SIGHUP to its shell), and stdin gave EOF to a reader that was
//! meant to wait. So a copy of every running container's descriptors is parked in the kernel:
//! SCM_RIGHTS messages queued on a `SOCK_SEQPACKET` socket pair that PID 1 creates at boot
//! ([`pair`]), keeps open for the machine's life and hands to every start of the runtime
//! ([`ENV`] names the two descriptors). A descriptor in flight stays open as long as the socket
//! that queues it, so the pipes and terminals outlive a runtime crash. PID 1 never reads the
//! queue: the runtime, single-threaded and never running twice at once, is its only reader and
//! writer. (systemd's file descriptor store does this job with a protocol; here the kernel's
//! queue is the store, which keeps PID 1's part to creating the pair.)
//!
//! The queue's discipline keeps every live descriptor in flight at every moment, so a crash at
//! any point loses nothing:
//! - [`FdStore::park`] appends one message for a new container;
//! - [`FdStore::compact`] sends a fresh marker, then every live container's descriptors again,
//!   then receives and closes everything queued before the marker;
//! - [`FdStore::restore`] sends a marker and receives up to it, sending each message back as it
//!   goes, so the queue is unchanged and the runtime holds a copy of everything.
//!
//! A crash inside `compact` leaves old entries and a marker in the queue: [`FdStore::restore`]
//! drops markers that are not its own, and of several entries for one container keeps the newest
//! generation.

use std::collections::BTreeMap;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::PathBuf;

use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType, recvmsg, sendmsg,
    setsockopt, socketpair, sockopt,
};
use serde::{Deserialize, Serialize};

/// Environment variable that names the pair's two descriptors, `<send>,<receive>`.
pub const ENV: &str = "NODEOS_FD_STORE";

/// Descriptors one message carries at most (the kernel's `SCM_MAX_FD` is 253).
const MAX_FDS: usize = 240;
/// Entries one message carries at most (each has at most four descriptors and a log path).
const MAX_ENTRIES: usize = MAX_FDS / 4;
/// Largest message header received; an entry is a few hundred bytes.
const MAX_HEADER: usize = 256 * 1024;
/// Send buffer asked for: a compaction has every live entry queued twice for a moment.
const SEND_BUFFER: usize = 8 << 20;

#[derive(Debug, thiserror::Error)]
pub enum FdStoreError {
    #[error("fd store: {what}: {source}")]
    Sys { what: &'static str, source: Errno },
    #[error("fd store: {ENV}={value:?} does not name two sockets")]
    Env { value: String },
    #[error("fd store: {0}")]
    Queue(String),
}

fn sys(what: &'static str) -> impl FnOnce(Errno) -> FdStoreError {
    move |source| FdStoreError::Sys { what, source }
}

/// One of a container's parked descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Kind {
    /// Read end of the stdout pipe.
    Stdout,
    /// Read end of the stderr pipe.
    Stderr,
    /// Master of the container's terminal (its output, and its input when `input` is set).
    Terminal,
    /// Write end of the stdin pipe.
    Stdin,
}

/// Where a container's output is logged (`LogWriter::open`'s arguments).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LogTarget {
    pub path: PathBuf,
    pub max_size: u64,
    pub max_files: usize,
}

/// What a parked message says of one container; its descriptors follow in the order of `kinds`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Parked {
    pub id: String,
    /// Later parkings of the same container carry higher generations.
    #[serde(default)]
    pub generation: u64,
    pub kinds: Vec<Kind>,
    pub tty: bool,
    pub stdin_once: bool,
    /// Whether `Attach` hands out the terminal as input (the container asked for stdin and, if
    /// `stdinOnce`, no client took it yet).
    #[serde(default)]
    pub input: bool,
    pub log: Option<LogTarget>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
enum Message {
    Mark(String),
    Entries(Vec<Parked>),
}

/// A parked container as the runtime hands it in: what to say and the descriptors to send.
pub type Outgoing<'a> = (Parked, Vec<BorrowedFd<'a>>);

/// A container's descriptors as [`FdStore::restore`] gives them back.
pub type Restored = BTreeMap<String, (Parked, Vec<OwnedFd>)>;

/// The runtime's side of the pair: it sends on one end and receives on the other.
#[derive(Debug)]
pub struct FdStore {
    send: OwnedFd,
    recv: OwnedFd,
    generation: u64,
    /// Receive buffer, kept between calls (a compaction receives one message per container).
    buf: Vec<u8>,
}

/// The pair PID 1 keeps (close-on-exec; PID 1 lets the runtime inherit it).
pub fn pair() -> Result<(OwnedFd, OwnedFd), FdStoreError> {
    socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(sys("socketpair"))
}

/// The store PID 1 handed this process, if [`ENV`] names one. The descriptors are checked to be
/// sockets before they are taken, and made close-on-exec so no container inherits them.
pub fn from_env() -> Result<Option<FdStore>, FdStoreError> {
    let Ok(value) = std::env::var(ENV) else {
        return Ok(None);
    };
    let (send, recv) = parse_env(&value)?;
    let adopt =
        |fd| crate::sys::adopt_inherited(fd).ok_or_else(|| FdStoreError::Env { value: value.clone() });
    let (send, recv) = (adopt(send)?, adopt(recv)?);
    for fd in [&send, &recv] {
        nix::fcntl::fcntl(
            fd.as_raw_fd(),
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )
        .map_err(sys("close-on-exec"))?;
    }
    Ok(Some(FdStore::new(send, recv)))
}

/// The two distinct open sockets (above stdio) that `value` names.
fn parse_env(value: &str) -> Result<(RawFd, RawFd), FdStoreError> {
    let bad = || FdStoreError::Env { value: value.into() };
    let fds: Vec<RawFd> = value
        .split(',')
        .map(|s| s.trim().parse::<RawFd>().map_err(|_| bad()))
        .collect::<Result<_, _>>()?;
    let [send, recv] = fds[..] else { return Err(bad()) };
    for fd in [send, recv] {
        let st = nix::sys::stat::fstat(fd).map_err(|_| bad())?;
        if fd < 3 || st.st_mode & nix::libc::S_IFMT != nix::libc::S_IFSOCK {
            return Err(bad());
        }
    }
    if send == recv {
        return Err(bad());
    }
    Ok((send, recv))
}

impl FdStore {
    /// A store over `send` (whose queue is `recv`'s). A larger send buffer is asked for; without
    /// the privilege the default one stays, which holds a few hundred messages.
    pub fn new(send: OwnedFd, recv: OwnedFd) -> Self {
        if setsockopt(&send, sockopt::SndBufForce, &SEND_BUFFER).is_err() {
            let _ = setsockopt(&send, sockopt::SndBuf, &SEND_BUFFER);
        }
        FdStore {
            send,
            recv,
            generation: 0,
            buf: Vec::new(),
        }
    }

    /// Appends the descriptors of newly started containers.
    pub fn park(&mut self, entries: Vec<Outgoing<'_>>) -> Result<(), FdStoreError> {
        self.generation += 1;
        let mut entries = entries;
        for (p, fds) in &mut entries {
            p.generation = self.generation;
            if p.kinds.len() != fds.len() {
                return Err(FdStoreError::Queue(format!(
                    "container {}: {} kinds for {} descriptors",
                    p.id,
                    p.kinds.len(),
                    fds.len()
                )));
            }
        }
        for chunk in entries.chunks(MAX_ENTRIES) {
            let header: Vec<Parked> = chunk.iter().map(|(p, _)| p.clone()).collect();
            let fds: Vec<RawFd> = chunk
                .iter()
                .flat_map(|(_, fds)| fds.iter().map(|f| f.as_raw_fd()))
                .collect();
            self.send(&Message::Entries(header), &fds)?;
        }
        Ok(())
    }

    /// Replaces everything parked by `live`: containers not in it lose their parked copies (a
    /// pipe whose last reader this was gets EPIPE; a stdin pipe whose last writer this was gets
    /// EOF).
    pub fn compact(&mut self, live: Vec<Outgoing<'_>>) -> Result<(), FdStoreError> {
        let mark = super::state::new_id().map_err(|e| FdStoreError::Queue(e.to_string()))?;
        self.send(&Message::Mark(mark.clone()), &[])?;
        // If parking fails, the old entries stay: a stale marker is all that is left behind.
        self.park(live)?;
        loop {
            match self.recv()? {
                None => {
                    return Err(FdStoreError::Queue(
                        "the compaction's marker was not found".into(),
                    ));
                }
                Some((Message::Mark(m), _)) if m == mark => return Ok(()),
                Some(_) => {}
            }
        }
    }

    /// A copy of every container's parked descriptors (the newest generation of each), leaving
    /// the queue as it was apart from stale markers. Later parkings continue the generations.
    pub fn restore(&mut self) -> Result<Restored, FdStoreError> {
        let mark = super::state::new_id().map_err(|e| FdStoreError::Queue(e.to_string()))?;
        self.send(&Message::Mark(mark.clone()), &[])?;
        let mut out = Restored::new();
        loop {
            let (entries, fds) = match self.recv()? {
                None => return Err(FdStoreError::Queue("the restore's marker was not found".into())),
                Some((Message::Mark(m), _)) if m == mark => break,
                Some((Message::Mark(_), _)) => continue,
                Some((Message::Entries(entries), fds)) => (entries, fds),
            };
            let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
            self.send(&Message::Entries(entries.clone()), &raw)?;
            let mut fds = fds.into_iter();
            for p in entries {
                let mine: Vec<OwnedFd> = fds.by_ref().take(p.kinds.len()).collect();
                if mine.len() != p.kinds.len() {
                    tracing::warn!(container = %p.id, "parked entry lacks descriptors; dropped");
                    continue;
                }
                self.generation = self.generation.max(p.generation);
                match out.get(&p.id) {
                    Some((have, _)) if have.generation >= p.generation => {}
                    _ => {
                        out.insert(p.id.clone(), (p, mine));
                    }
                }
            }
        }
        Ok(out)
    }

    fn send(&self, msg: &Message, fds: &[RawFd]) -> Result<(), FdStoreError> {
        let bytes = serde_json::to_vec(msg).map_err(|e| FdStoreError::Queue(e.to_string()))?;
        if bytes.len() > MAX_HEADER {
            return Err(FdStoreError::Queue(format!("a message of {} bytes", bytes.len())));
        }
        let iov = [IoSlice::new(&bytes)];
        let rights = [ControlMessage::ScmRights(fds)];
        let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &rights };
        let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL;
        loop {
            match sendmsg::<()>(self.send.as_raw_fd(), &iov, cmsgs, flags, None) {
                Ok(n) if n == bytes.len() => return Ok(()),
                Ok(n) => return Err(FdStoreError::Queue(format!("sent {n} of {} bytes", bytes.len()))),
                Err(Errno::EINTR) => {}
                Err(e) => return Err(sys("send")(e)),
            }
        }
    }

    /// The next queued message, None when the queue is empty. A message that does not parse is
    /// dropped with its descriptors (and reported), never handed on.
    fn recv(&mut self) -> Result<Option<(Message, Vec<OwnedFd>)>, FdStoreError> {
        self.buf.resize(MAX_HEADER, 0);
        let buf = &mut self.buf;
        loop {
            let mut space = nix::cmsg_space!([RawFd; 253]);
            let mut iov = [IoSliceMut::new(buf.as_mut_slice())];
            let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC;
            let (n, fds, truncated) =
                match recvmsg::<()>(self.recv.as_raw_fd(), &mut iov, Some(&mut space), flags) {
                    Ok(msg) => {
                        let mut fds = Vec::new();
                        for c in msg.cmsgs().map_err(sys("control message"))? {
                            if let ControlMessageOwned::ScmRights(raw) = c {
                                fds.extend(crate::sys::adopt_received(raw));
                            }
                        }
                        let truncated = msg.flags.intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC);
                        (msg.bytes, fds, truncated)
                    }
                    Err(Errno::EAGAIN) => return Ok(None),
                    Err(Errno::EINTR) => continue,
                    Err(e) => return Err(sys("receive")(e)),
                };
            if truncated {
                tracing::warn!(bytes = n, "fd store: a truncated message was dropped");
                continue;
            }
            match serde_json::from_slice::<Message>(&buf[..n]) {
                Ok(m) => return Ok(Some((m, fds))),
                Err(e) => tracing::warn!(error = %e, "fd store: an unreadable message was dropped"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::fcntl::OFlag;
    use nix::unistd::{pipe2, read, write};
    use std::os::fd::AsFd;

    fn parked(id: &str, kinds: &[Kind]) -> Parked {
        Parked {
            id: id.into(),
            generation: 0,
            kinds: kinds.to_vec(),
            tty: false,
            stdin_once: false,
            input: false,
            log: Some(LogTarget {
                path: format!("/var/log/pods/{id}/0.log").into(),
                max_size: 10 << 20,
                max_files: 5,
            }),
        }
    }

    /// A store over a fresh pair, and copies of both ends standing for PID 1's.
    fn store() -> (FdStore, [OwnedFd; 2]) {
        let (a, b) = pair().expect("socketpair");
        let keep = [a.try_clone().expect("dup"), b.try_clone().expect("dup")];
        (FdStore::new(a, b), keep)
    }

    /// The same pair as a restarted runtime gets it.
    fn reopen(keep: &[OwnedFd; 2]) -> FdStore {
        FdStore::new(
            keep[0].try_clone().expect("dup"),
            keep[1].try_clone().expect("dup"),
        )
    }

    fn nonblocking_pipe() -> (OwnedFd, OwnedFd) {
        pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).expect("pipe")
    }

    #[test]
    fn parked_pipes_outlive_the_process_that_read_them() {
        let (mut st, keep) = store();
        let (out_r, out_w) = nonblocking_pipe();
        let (in_r, in_w) = nonblocking_pipe();
        st.park(vec![(
            parked("c1", &[Kind::Stdout, Kind::Stdin]),
            vec![out_r.as_fd(), in_w.as_fd()],
        )])
        .expect("park");
        // The runtime crashes: its copies and its store are gone.
        drop((st, out_r, in_w));
        // The container writes on: no EPIPE; its stdin is not at EOF.
        assert_eq!(write(&out_w, b"tick 1\n"), Ok(7));
        assert_eq!(read(in_r.as_raw_fd(), &mut [0u8; 8]), Err(Errno::EAGAIN));
        let mut st = reopen(&keep);
        let mut got = st.restore().expect("restore");
        let (p, fds) = got.remove("c1").expect("c1 restored");
        assert_eq!(p.kinds, [Kind::Stdout, Kind::Stdin]);
        assert_eq!(p.log.as_ref().map(|l| l.max_files), Some(5));
        let mut buf = [0u8; 16];
        assert_eq!(
            read(fds[0].as_raw_fd(), &mut buf),
            Ok(7),
            "the output written meanwhile"
        );
        assert_eq!(&buf[..7], b"tick 1\n");
        assert_eq!(write(&fds[1], b"typed\n"), Ok(6), "stdin is writable again");
        assert_eq!(read(in_r.as_raw_fd(), &mut buf), Ok(6));
        // Restoring left the queue as it was: a second restart finds it again.
        drop((st, fds));
        let again = reopen(&keep).restore().expect("restore");
        assert!(again.contains_key("c1"));
    }

    #[test]
    fn compaction_closes_what_is_no_longer_live() {
        let (mut st, keep) = store();
        let (a_r, a_w) = nonblocking_pipe();
        let (b_in_r, b_in_w) = nonblocking_pipe();
        st.park(vec![(parked("a", &[Kind::Stdout]), vec![a_r.as_fd()])])
            .expect("park a");
        st.park(vec![(parked("b", &[Kind::Stdin]), vec![b_in_w.as_fd()])])
            .expect("park b");
        // a exited and its pipe was drained; b's stdinOnce input was taken and closed.
        drop((a_r, b_in_w));
        let (c_r, _c_w) = nonblocking_pipe();
        st.compact(vec![(parked("c", &[Kind::Stdout]), vec![c_r.as_fd()])])
            .expect("compact");
        assert_eq!(write(&a_w, b"x"), Err(Errno::EPIPE), "a's last reader is gone");
        assert_eq!(
            read(b_in_r.as_raw_fd(), &mut [0u8; 4]),
            Ok(0),
            "b's stdin is at EOF"
        );
        let got = reopen(&keep).restore().expect("restore");
        assert_eq!(got.keys().collect::<Vec<_>>(), ["c"]);
    }

    #[test]
    fn a_compaction_cut_short_leaves_the_newest_entries_to_restore() {
        let (mut st, keep) = store();
        let (r1, _w1) = nonblocking_pipe();
        let (r2, _w2) = nonblocking_pipe();
        st.park(vec![(
            parked("c", &[Kind::Stdout, Kind::Stdin]),
            vec![r1.as_fd(), r2.as_fd()],
        )])
        .expect("park");
        // As compact up to its crash: a marker and the new entries, nothing received yet.
        st.send(&Message::Mark("stale".into()), &[]).expect("mark");
        st.park(vec![(parked("c", &[Kind::Stdout]), vec![r1.as_fd()])])
            .expect("park again");
        drop(st);
        let mut st = reopen(&keep);
        let got = st.restore().expect("restore");
        assert_eq!(got["c"].0.kinds, [Kind::Stdout], "the newest generation wins");
        assert_eq!(got["c"].0.generation, 2);
        // The stale marker is gone and later generations go on from the newest seen.
        st.park(vec![(parked("d", &[]), vec![])]).expect("park d");
        let got = reopen(&keep).restore().expect("restore");
        assert_eq!(got["d"].0.generation, 3);
    }

    #[test]
    fn many_containers_fit_and_mismatched_entries_are_refused() {
        let (mut st, keep) = store();
        let pipes: Vec<_> = (0..150).map(|_| nonblocking_pipe()).collect();
        let live: Vec<Outgoing<'_>> = pipes
            .iter()
            .enumerate()
            .map(|(i, (r, _))| (parked(&format!("c{i}"), &[Kind::Stdout]), vec![r.as_fd()]))
            .collect();
        st.park(live.clone()).expect("park 150");
        st.compact(live).expect("compact 150");
        assert_eq!(reopen(&keep).restore().expect("restore").len(), 150);
        let bad = st.park(vec![(
            parked("x", &[Kind::Stdout, Kind::Stderr]),
            vec![pipes[0].0.as_fd()],
        )]);
        assert!(matches!(bad, Err(FdStoreError::Queue(_))));
    }

    #[test]
    fn the_environment_must_name_two_sockets() {
        let (a, b) = pair().expect("socketpair");
        let (r, _w) = nonblocking_pipe();
        for v in [
            "",
            "3",
            "x,y",
            &format!("{},{}", a.as_raw_fd(), a.as_raw_fd()),
            &format!("{},{}", a.as_raw_fd(), r.as_raw_fd()),
        ] {
            assert!(parse_env(v).is_err(), "{v:?} accepted");
        }
        assert!(parse_env(&format!("{},{}", a.as_raw_fd(), b.as_raw_fd())).is_ok());
    }
}
