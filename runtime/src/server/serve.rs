//! The loop: one `poll(2)` over the socket, the connections, every process's pidfd and every
//! pipe the runtime reads; replies that wait for an event go out when it happens.
//!
//! Requests are served one connection's in order, but across connections by [`urgency`]: the
//! runtime is one thread, and a burst of new pods would otherwise queue every sandbox ahead of
//! the containers of the pods already under way (measured with 30 pods created at once: every
//! pod waited for all 30 sandboxes, ~6.7 s, before its container was created) and ahead of the
//! execs of running pods' probes. After a slow request the loop looks at its descriptors again,
//! so a request that arrived meanwhile can go first.

use std::collections::{BTreeMap, VecDeque};
use std::fs;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use runtime_api::{ErrorKind, Reply, ReplyError, Request, recv_some, send_line};

use super::errors::{RuntimeError, errno_ctx, io_ctx};
use super::{Options, Runtime};

/// What a polled descriptor belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    Listener,
    Conn(u64),
    /// A container's stdout (0) or stderr (1).
    Output(String, usize),
    Container(String),
    Exec(String),
    /// An `ExecSync`'s stdout (0) or stderr (1).
    ExecOutput(String, usize),
    Pause(String),
    Pull(String),
    PullOutput(String),
    /// A build helper (by token).
    Build(u64),
}

struct Conn {
    stream: UnixStream,
    buf: Vec<u8>,
    fds: Vec<OwnedFd>,
    /// Requests received and not served yet, in their order (a line that did not parse is
    /// answered with the parse error in its turn).
    requests: VecDeque<Result<Request, serde_json::Error>>,
}

impl Conn {
    fn new(stream: UnixStream) -> Self {
        Conn {
            stream,
            buf: Vec::new(),
            fds: Vec::new(),
            requests: VecDeque::new(),
        }
    }

    /// Moves the complete lines received into `requests`.
    fn parse_lines(&mut self) {
        while let Some(nl) = self.buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=nl).collect();
            self.requests.push_back(serde_json::from_slice::<Request>(&line));
        }
    }
}

/// How soon a pending request is served; lower first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Urgency {
    /// Reads, stops, execs (probes), attaches, pulls: short, or waited on by a running pod.
    Now,
    /// The next steps of pods already under way, and their removal.
    UnderWay,
    /// A new pod's sandbox.
    NewPod,
}

fn urgency(req: &Result<Request, serde_json::Error>) -> Urgency {
    match req {
        Ok(Request::RunSandbox { .. }) => Urgency::NewPod,
        Ok(
            Request::CreateContainer { .. }
            | Request::StartContainer { .. }
            | Request::RemoveContainer { .. }
            | Request::StopSandbox { .. }
            | Request::RemoveSandbox { .. },
        ) => Urgency::UnderWay,
        _ => Urgency::Now,
    }
}

/// Whether a request starts a build (see `build`).
fn is_build(req: &Result<Request, serde_json::Error>) -> bool {
    matches!(
        req,
        Ok(Request::RunSandbox { .. } | Request::CreateContainer { .. })
    )
}

/// The connection whose next request goes first: the most urgent, the oldest connection among
/// equals; requests that start a build wait while `builds_full`.
fn next_conn(conns: &BTreeMap<u64, Conn>, builds_full: bool) -> Option<(u64, Urgency)> {
    conns
        .iter()
        .filter_map(|(id, c)| {
            let req = c.requests.front()?;
            (!(builds_full && is_build(req))).then(|| (*id, urgency(req)))
        })
        .min_by_key(|(id, u)| (*u, *id))
}

/// Writes `reply` with `fds` attached (closed here once sent).
fn send_reply(conns: &mut BTreeMap<u64, Conn>, id: u64, reply: &Reply, fds: Vec<OwnedFd>) {
    let Some(c) = conns.get_mut(&id) else { return };
    let mut line = serde_json::to_vec(reply).unwrap_or_else(|_| {
        br#"{"result":"error","kind":"Internal","message":"encoding the reply failed"}"#.to_vec()
    });
    line.push(b'\n');
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    if send_line(&c.stream, &line, &raw).is_err() {
        conns.remove(&id);
    }
}

impl Runtime {
    /// Kills what ran out of time; the time until the next deadline.
    fn deadlines(&mut self) -> Option<Duration> {
        let now = Instant::now();
        let a = self.container_deadlines(now);
        let b = self.exec_deadlines(now);
        // Untracked children still alive are looked at again soon.
        let c = self.reap_strays().then_some(STRAY_SWEEP);
        [a, b, c].into_iter().flatten().min()
    }

    /// Every descriptor to watch, with what it belongs to.
    fn watched(&self) -> Vec<(Source, BorrowedFd<'_>)> {
        let mut out = Vec::new();
        for (id, c) in &self.containers {
            if let Some(run) = &c.run {
                out.push((Source::Container(id.clone()), run.pidfd.as_fd()));
                for (i, p) in run.pipes.iter().enumerate() {
                    if let Some(p) = p {
                        out.push((Source::Output(id.clone(), i), p.as_fd()));
                    }
                }
            }
        }
        for (id, e) in &self.execs {
            if let Some(p) = &e.pidfd {
                out.push((Source::Exec(id.clone()), p.as_fd()));
            }
            for (i, p) in e.capture.iter().flat_map(|c| c.pipes.iter()).enumerate() {
                if let Some(p) = p {
                    out.push((Source::ExecOutput(id.clone(), i), p.as_fd()));
                }
            }
        }
        for (id, s) in &self.sandboxes {
            if let Some(p) = &s.pidfd {
                out.push((Source::Pause(id.clone()), p.as_fd()));
            }
        }
        for (token, b) in &self.builds {
            if let Some(fd) = &b.pidfd {
                out.push((Source::Build(*token), fd.as_fd()));
            }
        }
        for (name, p) in &self.pulls {
            if let Some(fd) = &p.pidfd {
                out.push((Source::Pull(name.clone()), fd.as_fd()));
            }
            if let Some(fd) = &p.out {
                out.push((Source::PullOutput(name.clone()), fd.as_fd()));
            }
        }
        out
    }

    /// A watched descriptor is ready.
    fn on_ready(&mut self, src: &Source) {
        match src {
            Source::Output(id, i) => self.on_container_output(id, *i),
            Source::ExecOutput(id, i) => self.on_exec_output(id, *i),
            Source::PullOutput(name) => self.on_pull_output(name),
            Source::Container(id) => self.on_container_exit(id),
            Source::Exec(id) => self.on_exec_exit(id),
            Source::Pause(id) => self.on_pause_exit(id),
            Source::Pull(name) => self.on_pull_exit(name),
            Source::Build(token) => self.on_build_exit(*token),
            Source::Listener | Source::Conn(_) => {}
        }
    }
}

/// How often untracked children are looked for while some live.
const STRAY_SWEEP: Duration = Duration::from_millis(500);

/// Output sources are handled before exits, so an exit drains everything the process wrote.
fn is_output(s: &Source) -> bool {
    matches!(
        s,
        Source::Output(..) | Source::ExecOutput(..) | Source::PullOutput(_)
    )
}

/// Runs the runtime until the process is killed.
pub fn serve(opts: Options) -> Result<(), RuntimeError> {
    let socket = opts.socket.clone();
    let fd_store = super::fdstore::from_env().unwrap_or_else(|e| {
        tracing::warn!(error = %e, "no fd store: containers' stdio will not survive a restart");
        None
    });
    let mut rt = Runtime::open(opts, fd_store)?;
    // Containers' init processes are the children of build helpers, and come to the runtime
    // when those end (see `build`).
    nix::sys::prctl::set_child_subreaper(true).map_err(errno_ctx("becoming a child subreaper"))?;
    if let Some(dir) = socket.parent() {
        fs::create_dir_all(dir).map_err(io_ctx(dir.display().to_string()))?;
    }
    let _ = fs::remove_file(&socket);
    let listener =
        UnixListener::bind(&socket).map_err(io_ctx(format!("listening on {}", socket.display())))?;
    listener.set_nonblocking(true).map_err(io_ctx("listener"))?;
    tracing::info!(socket = %socket.display(), "runtime ready");
    let mut conns: BTreeMap<u64, Conn> = BTreeMap::new();
    let mut next_conn_id = 0u64;
    loop {
        let timeout = rt.deadlines();
        let mut srcs: Vec<Source> = vec![Source::Listener];
        let mut borrowed: Vec<BorrowedFd<'_>> = vec![listener.as_fd()];
        for (id, c) in &conns {
            srcs.push(Source::Conn(*id));
            borrowed.push(c.stream.as_fd());
        }
        for (s, fd) in rt.watched() {
            srcs.push(s);
            borrowed.push(fd);
        }
        let mut fds: Vec<PollFd<'_>> = borrowed
            .iter()
            .map(|b| PollFd::new(*b, PollFlags::POLLIN))
            .collect();
        // Requests still waiting that can be served: look and come straight back.
        let t = if next_conn(&conns, rt.builds_full()).is_some() {
            PollTimeout::ZERO
        } else {
            match timeout {
                Some(d) => {
                    PollTimeout::try_from(d.as_millis().min(60_000) as i32 + 1).unwrap_or(PollTimeout::MAX)
                }
                None => PollTimeout::NONE,
            }
        };
        match poll(&mut fds, t) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => {
                tracing::error!(error = %e, "poll failed");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let ready: Vec<Source> = fds
            .iter()
            .zip(&srcs)
            .filter(|(f, _)| f.revents().is_some_and(|r| !r.is_empty()))
            .map(|(_, s)| s.clone())
            .collect();
        drop(fds);
        drop(borrowed);
        for src in ready.iter().filter(|s| is_output(s)) {
            rt.on_ready(src);
        }
        for src in ready.iter().filter(|s| !is_output(s)) {
            match src {
                Source::Listener => {
                    while let Ok((stream, _)) = listener.accept() {
                        // A client that stops reading its replies must not stall the runtime:
                        // a reply that cannot be written in 5 s drops the connection.
                        if stream.set_write_timeout(Some(Duration::from_secs(5))).is_err() {
                            continue;
                        }
                        next_conn_id += 1;
                        conns.insert(next_conn_id, Conn::new(stream));
                    }
                }
                Source::Conn(id) => {
                    let Some(c) = conns.get_mut(id) else { continue };
                    // A client that left is not answered: what it asked and was not served
                    // yet is dropped with it.
                    if recv_some(c.stream.as_raw_fd(), &mut c.buf, &mut c.fds).unwrap_or(0) == 0 {
                        conns.remove(id);
                        continue;
                    }
                    c.parse_lines();
                }
                other => rt.on_ready(other),
            }
        }
        // Quick requests in one go; after a slow one, back to poll.
        while let Some((id, urgency)) = next_conn(&conns, rt.builds_full()) {
            let Some(c) = conns.get_mut(&id) else { break };
            let Some(req) = c.requests.pop_front() else { break };
            let mut fds = std::mem::take(&mut c.fds);
            let reply = match req {
                Ok(req) => rt.handle(id, req, &mut fds),
                Err(e) => Some(Reply::Error(ReplyError::new(
                    ErrorKind::Invalid,
                    format!("bad request: {e}"),
                ))),
            };
            if let Some(c) = conns.get_mut(&id) {
                c.fds = fds;
            }
            let out_fds = std::mem::take(&mut rt.reply_fds);
            if let Some(r) = reply {
                send_reply(&mut conns, id, &r, out_fds);
            }
            if urgency != Urgency::Now {
                break;
            }
        }
        for (conn, reply) in std::mem::take(&mut rt.outbox) {
            send_reply(&mut conns, conn, &reply, Vec::new());
        }
        rt.compact_fd_store();
    }
}

#[cfg(test)]
mod tests {
    use runtime_api::PullPolicy;

    use super::*;

    /// A connection holding `lines` received and not yet served.
    fn conn_with(lines: &[&str]) -> Conn {
        let (stream, _peer) = UnixStream::pair().expect("socketpair");
        let mut c = Conn::new(stream);
        for l in lines {
            c.buf.extend_from_slice(l.as_bytes());
            c.buf.push(b'\n');
        }
        c.parse_lines();
        c
    }

    fn line(req: &Request) -> String {
        serde_json::to_string(req).expect("encode")
    }

    #[test]
    fn requests_are_ranked_by_urgency() {
        let run = Request::RunSandbox {
            config: runtime_api::SandboxConfig::default(),
        };
        let create = Request::CreateContainer {
            sandbox_id: "s".into(),
            config: runtime_api::ContainerConfig::default(),
        };
        let id = || "c".to_string();
        let table = [
            (run, Urgency::NewPod),
            (create, Urgency::UnderWay),
            (Request::StartContainer { id: id() }, Urgency::UnderWay),
            (Request::RemoveContainer { id: id() }, Urgency::UnderWay),
            (Request::StopSandbox { id: id() }, Urgency::UnderWay),
            (Request::RemoveSandbox { id: id() }, Urgency::UnderWay),
            (
                Request::StopContainer {
                    id: id(),
                    timeout_seconds: 2,
                },
                Urgency::Now,
            ),
            (Request::ContainerStatus { id: id() }, Urgency::Now),
            (Request::ListContainers, Urgency::Now),
            (Request::ListPodStats, Urgency::Now),
            (
                Request::ExecSync {
                    id: id(),
                    command: vec!["true".into()],
                    timeout_seconds: 1,
                },
                Urgency::Now,
            ),
        ];
        for (req, want) in table {
            assert_eq!(urgency(&Ok(req.clone())), want, "{req:?}");
        }
        let bad = serde_json::from_str::<Request>("bad");
        assert_eq!(urgency(&bad), Urgency::Now);
    }

    #[test]
    fn the_most_urgent_request_goes_first_and_each_connection_keeps_its_order() {
        let sandbox = line(&Request::RunSandbox {
            config: runtime_api::SandboxConfig::default(),
        });
        let start = line(&Request::StartContainer { id: "c".into() });
        let list = line(&Request::ListContainers);
        let mut conns = BTreeMap::new();
        // Older connections wait for sandboxes; a newer one has the next step of a pod under
        // way; the newest a read queued behind a sandbox of its own.
        conns.insert(1, conn_with(&[&sandbox]));
        conns.insert(2, conn_with(&[&sandbox]));
        conns.insert(3, conn_with(&[&start]));
        conns.insert(4, conn_with(&[&sandbox, &list]));
        conns.insert(5, conn_with(&[]));
        let mut order = Vec::new();
        while let Some((id, u)) = next_conn(&conns, false) {
            order.push((id, u));
            conns.get_mut(&id).and_then(|c| c.requests.pop_front());
        }
        assert_eq!(
            order,
            [
                (3, Urgency::UnderWay),
                (1, Urgency::NewPod),
                (2, Urgency::NewPod),
                (4, Urgency::NewPod),
                (4, Urgency::Now),
            ]
        );
        // A line that does not parse still takes its turn (to be answered with the error).
        let mut c = conn_with(&["{not json", &list]);
        assert!(c.requests.pop_front().is_some_and(|r| r.is_err()));
        assert!(matches!(
            c.requests.pop_front(),
            Some(Ok(Request::ListContainers))
        ));
        // A partial line waits for its end.
        let mut c = conn_with(&[]);
        c.buf.extend_from_slice(list.as_bytes());
        c.parse_lines();
        assert!(c.requests.is_empty());
    }

    #[test]
    fn requests_that_start_builds_wait_while_builds_are_full() {
        let sandbox = line(&Request::RunSandbox {
            config: Default::default(),
        });
        let create = line(&Request::CreateContainer {
            sandbox_id: "s".into(),
            config: Default::default(),
        });
        let start = line(&Request::StartContainer { id: "c".into() });
        let list = line(&Request::ListContainers);
        let mut conns = BTreeMap::new();
        conns.insert(1, conn_with(&[&sandbox]));
        conns.insert(2, conn_with(&[&create, &list]));
        conns.insert(3, conn_with(&[&start]));
        let mut order = Vec::new();
        while let Some((id, u)) = next_conn(&conns, true) {
            order.push((id, u));
            conns.get_mut(&id).and_then(|c| c.requests.pop_front());
        }
        // The start goes; the builds wait, and the read behind one waits with it.
        assert_eq!(order, [(3, Urgency::UnderWay)]);
        assert_eq!(next_conn(&conns, false), Some((2, Urgency::UnderWay)));
    }

    #[test]
    fn a_build_runs_in_a_helper_and_its_failure_comes_back_with_its_kind() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut rt = crate::server::test_runtime(dir.path());
        let sandbox_dir = dir.path().join("state/sandboxes/id-web");
        fs::create_dir_all(&sandbox_dir).expect("sandbox dir");
        let pending = crate::server::sandbox::PendingSandbox::for_test("web", sandbox_dir.clone());
        let started = rt.start_build(7, super::super::build::Then::Sandbox(Box::new(pending)), || {
            std::thread::sleep(Duration::from_millis(300));
            Err(RuntimeError::Invalid("the image has no such user".into()))
        });
        assert!(started.is_ok(), "{started:?}");
        assert_eq!(rt.builds.len(), 1);
        // Meanwhile the runtime answers other requests.
        assert!(matches!(
            rt.handle(3, Request::ListSandboxes, &mut Vec::new()),
            Some(Reply::Sandboxes { items }) if items.is_empty()
        ));
        let replies = run_until_replies(&mut rt, 1);
        assert_eq!(replies.len(), 1, "{replies:?}");
        let (conn, reply) = &replies[0];
        assert_eq!(*conn, 7);
        assert!(
            matches!(reply, Reply::Error(e) if e.kind == ErrorKind::Invalid && e.message == "the image has no such user"),
            "{reply:?}"
        );
        // The failed sandbox left nothing: no record, no build, no directory.
        assert!(rt.builds.is_empty());
        assert!(rt.sandboxes.is_empty());
        assert!(!sandbox_dir.exists());
    }

    /// Polls the runtime's own descriptors (no socket) until `n` replies are out.
    fn run_until_replies(rt: &mut Runtime, n: usize) -> Vec<(u64, Reply)> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while rt.outbox.len() < n && Instant::now() < deadline {
            let watched = rt.watched();
            let srcs: Vec<Source> = watched.iter().map(|(s, _)| s.clone()).collect();
            let mut fds: Vec<PollFd<'_>> = watched
                .iter()
                .map(|(_, fd)| PollFd::new(*fd, PollFlags::POLLIN))
                .collect();
            let _ = poll(&mut fds, PollTimeout::from(100u16));
            let ready: Vec<Source> = fds
                .iter()
                .zip(&srcs)
                .filter(|(f, _)| f.revents().is_some_and(|r| !r.is_empty()))
                .map(|(_, s)| s.clone())
                .collect();
            drop(fds);
            drop(watched);
            for src in ready.iter().filter(|s| is_output(s)) {
                rt.on_ready(src);
            }
            for src in ready.iter().filter(|s| !is_output(s)) {
                rt.on_ready(src);
            }
        }
        std::mem::take(&mut rt.outbox)
    }

    #[test]
    fn a_pull_runs_in_a_child_and_every_waiter_gets_its_result() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut rt = crate::server::test_runtime(dir.path());
        // Nothing listens on the discard port: the child's pull fails to connect.
        let pull = || Request::PullImage {
            image: "127.0.0.1:9/x:1".into(),
            policy: PullPolicy::Always,
            auth: None,
            insecure_registries: vec![],
        };
        assert!(rt.handle(1, pull(), &mut Vec::new()).is_none(), "answered later");
        assert!(
            rt.handle(2, pull(), &mut Vec::new()).is_none(),
            "joins the first pull"
        );
        assert_eq!(rt.pulls.len(), 1);
        // Meanwhile the runtime answers other requests.
        assert!(matches!(
            rt.handle(3, Request::ListImages, &mut Vec::new()),
            Some(Reply::Images { .. })
        ));
        let replies = run_until_replies(&mut rt, 2);
        let conns: Vec<u64> = replies.iter().map(|(c, _)| *c).collect();
        assert_eq!(conns, [1, 2]);
        for (_, r) in &replies {
            assert!(
                matches!(r, Reply::Error(e) if e.kind == ErrorKind::Unavailable && e.message.contains("127.0.0.1:9")),
                "{r:?}"
            );
        }
        assert!(rt.pulls.is_empty(), "the child was reaped");
        let scratch: Vec<_> = std::fs::read_dir(dir.path().join("images/tmp"))
            .expect("tmp")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(
            scratch.len(),
            1,
            "only the runtime's own scratch directory: {scratch:?}"
        );
    }
}
