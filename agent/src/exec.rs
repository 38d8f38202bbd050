//! `kubectl exec` on the node: `GET /exec/<namespace>/<pod>/<container>?command=...` upgraded to a
//! WebSocket speaking the `v5.channel.k8s.io` protocol (binary frames whose first byte is the
//! channel: 0 stdin, 1 stdout, 2 stderr, 3 the final Status, 4 terminal resize, 255 close of a
//! stream). The process runs through the runtime (`Exec`, stdio passed as descriptors): pipes,
//! or a pseudo-terminal with `tty=true`.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;

use base64::Engine;
use serde_json::json;
use sha1::{Digest, Sha1};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// The only subprotocol served.
pub const PROTOCOL: &str = "v5.channel.k8s.io";

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
const RESIZE: u8 = 4;
const CLOSE: u8 = 255;

/// Largest client frame accepted (stdin chunks and resize messages are small).
const MAX_FRAME: u64 = 1 << 20;

/// `Sec-WebSocket-Accept` for a `Sec-WebSocket-Key` (RFC 6455 §4.2.2).
pub fn accept_key(key: &str) -> String {
    let mut h = Sha1::new();
    h.update(key.trim().as_bytes());
    h.update(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
    base64::engine::general_purpose::STANDARD.encode(h.finalize())
}

/// What the request asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecRequest {
    pub command: Vec<String>,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

impl ExecRequest {
    /// Parses the query (`command` repeated, `stdin`/`stdout`/`stderr`/`tty` flags).
    pub fn parse(query: Option<&str>) -> Result<Self, String> {
        let mut r = ExecRequest::default();
        for pair in query.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let flag = matches!(v, "true" | "1");
            match k {
                "command" => r.command.push(kcore::url::percent_decode(v)),
                "stdin" => r.stdin = flag,
                "stdout" => r.stdout = flag,
                "stderr" => r.stderr = flag,
                "tty" => r.tty = flag,
                _ => {}
            }
        }
        if r.command.is_empty() {
            return Err("you must specify at least 1 command".into());
        }
        Ok(r)
    }
}

/// The runtime id of the running container `name` of pod `namespace/pod`.
pub fn find_container(namespace: &str, pod: &str, name: &str) -> Result<String, String> {
    let mut client =
        runtime::api::Client::connect(Path::new(runtime::api::SOCKET)).map_err(|e| e.to_string())?;
    let sandboxes = client.list_sandboxes().map_err(|e| e.to_string())?;
    let ids: Vec<&str> = sandboxes
        .iter()
        .filter(|s| s.namespace == namespace && s.name == pod)
        .map(|s| s.id.as_str())
        .collect();
    let containers = client.list_containers().map_err(|e| e.to_string())?;
    containers
        .iter()
        .find(|c| {
            ids.contains(&c.sandbox_id.as_str()) && c.name == name && c.state == runtime::api::State::Running
        })
        .map(|c| c.id.clone())
        .ok_or_else(|| format!("container {name} in pod {namespace}/{pod} is not running on this node"))
}

/// One WebSocket frame from the client.
struct Frame {
    fin: bool,
    opcode: u8,
    payload: Vec<u8>,
}

async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<Frame> {
    let mut head = [0u8; 2];
    r.read_exact(&mut head).await?;
    let fin = head[0] & 0x80 != 0;
    let opcode = head[0] & 0x0f;
    let masked = head[1] & 0x80 != 0;
    let len = match head[1] & 0x7f {
        126 => u64::from(r.read_u16().await?),
        127 => r.read_u64().await?,
        n => u64::from(n),
    };
    if len > MAX_FRAME {
        return Err(std::io::Error::other(format!("frame of {len} bytes")));
    }
    let mut mask = [0u8; 4];
    if masked {
        r.read_exact(&mut mask).await?;
    }
    let mut payload = vec![0u8; len as usize];
    r.read_exact(&mut payload).await?;
    if masked {
        for (i, b) in payload.iter_mut().enumerate() {
            *b ^= mask[i % 4];
        }
    }
    Ok(Frame { fin, opcode, payload })
}

/// Client messages: data messages reassembled from their fragments (RFC 6455 §5.4), control
/// frames (close, ping) as they come.
struct MessageReader<R> {
    inner: R,
    partial: Option<(u8, Vec<u8>)>,
}

impl<R: AsyncRead + Unpin> MessageReader<R> {
    async fn next(&mut self) -> std::io::Result<(u8, Vec<u8>)> {
        loop {
            let f = read_frame(&mut self.inner).await?;
            if f.opcode >= 8 {
                return Ok((f.opcode, f.payload));
            }
            let (opcode, mut data) = match (f.opcode, self.partial.take()) {
                (0, Some((op, mut buf))) => {
                    buf.extend_from_slice(&f.payload);
                    (op, buf)
                }
                (0, None) => return Err(std::io::Error::other("continuation without a message")),
                (op, _) => (op, f.payload),
            };
            if data.len() as u64 > MAX_FRAME {
                return Err(std::io::Error::other("message too large"));
            }
            if f.fin {
                return Ok((opcode, std::mem::take(&mut data)));
            }
            self.partial = Some((opcode, data));
        }
    }
}

/// A server frame (FIN set, unmasked).
fn frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 10);
    out.push(0x80 | opcode);
    match payload.len() {
        n if n < 126 => out.push(n as u8),
        n if n <= 0xffff => {
            out.push(126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(payload);
    out
}

/// A binary frame on `channel`.
fn channel_frame(channel: u8, data: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(data.len() + 1);
    p.push(channel);
    p.extend_from_slice(data);
    frame(2, &p)
}

/// The Status kubectl reads from channel 3 (its exit code comes from the `ExitCode` cause).
pub fn status(exit: Result<i32, String>) -> serde_json::Value {
    match exit {
        Ok(0) => json!({"metadata": {}, "status": "Success"}),
        Ok(code) => json!({
            "metadata": {}, "status": "Failure",
            "message": format!("command terminated with non-zero exit code: exit status {code}"),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
        }),
        Err(e) => json!({"metadata": {}, "status": "Failure", "message": e, "reason": "InternalError"}),
    }
}

/// Copies a descriptor's output to the client on `channel` until EOF (or EIO, a closed
/// terminal). Reads are asynchronous, so dropping the task closes the descriptor.
async fn pump_output(fd: OwnedFd, channel: u8, out: mpsc::Sender<Vec<u8>>) {
    if runtime::pty::set_nonblocking(fd.as_fd()).is_err() {
        return;
    }
    // `AsyncFd::new` is deprecated because a `T` that does not own its descriptor could close it
    // while registered; here `T` is a `File` that owns it alone, which is the sound case (the
    // replacement, `register`, is `unsafe`, which this crate forbids).
    #[allow(deprecated)]
    let Ok(afd) = tokio::io::unix::AsyncFd::new(std::fs::File::from(fd)) else {
        return;
    };
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let Ok(mut guard) = afd.readable().await else {
            return;
        };
        match guard.try_io(|f| {
            let mut file: &std::fs::File = f.get_ref();
            file.read(&mut buf)
        }) {
            Ok(Ok(0) | Err(_)) => return,
            Ok(Ok(n)) => {
                if out.send(channel_frame(channel, &buf[..n])).await.is_err() {
                    return;
                }
            }
            Err(_would_block) => {}
        }
    }
}

/// Runs `req` in container `id` and serves the session on `io` until the process has exited and
/// its output is delivered.
pub async fn serve<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(io: S, id: String, req: ExecRequest) {
    let (mut rd, mut wr) = tokio::io::split(io);
    let (out_tx, mut out_rx) = mpsc::channel::<Vec<u8>>(64);
    let writer = tokio::spawn(async move {
        while let Some(f) = out_rx.recv().await {
            if wr.write_all(&f).await.is_err() {
                return;
            }
        }
        let _ = wr.shutdown().await;
    });
    let mut messages = MessageReader {
        inner: &mut rd,
        partial: None,
    };
    let exit = run(&mut messages, id, req, out_tx.clone()).await;
    // None: the client left; there is nobody to tell.
    if let Some(exit) = exit {
        let status = status(exit).to_string();
        let _ = out_tx.send(channel_frame(ERROR, status.as_bytes())).await;
        let _ = out_tx.send(frame(8, &1000u16.to_be_bytes())).await;
    }
    drop(out_tx);
    let _ = writer.await;
}

/// How long output is still relayed after the process exited (a background child may keep the
/// pipes open).
const DRAIN: std::time::Duration = std::time::Duration::from_secs(2);

/// The exit code (or why there is none); None when the client left first. Leaving closes the
/// process's stdin and our ends of its output (a terminal hangs up), and stops waiting for it.
async fn run<R: AsyncRead + Unpin>(
    rd: &mut MessageReader<R>,
    id: String,
    req: ExecRequest,
    out: mpsc::Sender<Vec<u8>>,
) -> Option<Result<i32, String>> {
    Some(match start(id, &req).await {
        Ok(session) => return relay(rd, session, &req, out).await,
        Err(e) => Err(e),
    })
}

/// A started exec: its id and our ends of its stdio.
struct Session {
    exec_id: String,
    stdin: OwnedFd,
    outputs: Vec<(OwnedFd, u8)>,
}

async fn start(id: String, req: &ExecRequest) -> Result<Session, String> {
    let io_err = |e: std::io::Error| e.to_string();
    // Our ends: where stdin goes, what we read output from; the process's ends go to the runtime.
    let (stdin_ours, outputs, child): (OwnedFd, Vec<(OwnedFd, u8)>, [OwnedFd; 3]) = if req.tty {
        let (master, slave) = runtime::pty::openpty().map_err(io_err)?;
        let reader = master.try_clone().map_err(io_err)?;
        let c = [
            slave.try_clone().map_err(io_err)?,
            slave.try_clone().map_err(io_err)?,
            slave,
        ];
        (master, vec![(reader, STDOUT)], c)
    } else {
        let (in_r, in_w) = std::io::pipe().map_err(io_err)?;
        let (out_r, out_w) = std::io::pipe().map_err(io_err)?;
        let (err_r, err_w) = std::io::pipe().map_err(io_err)?;
        (
            in_w.into(),
            vec![(out_r.into(), STDOUT), (err_r.into(), STDERR)],
            [in_r.into(), out_w.into(), err_w.into()],
        )
    };
    let command = req.command.clone();
    let exec_id = tokio::task::spawn_blocking(move || {
        let mut client =
            runtime::api::Client::connect(Path::new(runtime::api::SOCKET)).map_err(|e| e.to_string())?;
        let fds = [child[0].as_raw_fd(), child[1].as_raw_fd(), child[2].as_raw_fd()];
        let r = client.exec(&id, command, fds).map_err(|e| e.to_string());
        drop(child); // The process has its own copies now: EOF reaches us when it exits.
        r
    })
    .await
    .map_err(|e| e.to_string())??;
    Ok(Session {
        exec_id,
        stdin: stdin_ours,
        outputs,
    })
}

async fn relay<R: AsyncRead + Unpin>(
    rd: &mut MessageReader<R>,
    session: Session,
    req: &ExecRequest,
    out: mpsc::Sender<Vec<u8>>,
) -> Option<Result<i32, String>> {
    let Session {
        exec_id,
        stdin: stdin_ours,
        outputs,
    } = session;
    let pumps: Vec<_> = outputs
        .into_iter()
        .map(|(fd, channel)| tokio::spawn(pump_output(fd, channel, out.clone())))
        .collect();
    let waiter = tokio::task::spawn_blocking(move || {
        let mut client =
            runtime::api::Client::connect(Path::new(runtime::api::SOCKET)).map_err(|e| e.to_string())?;
        client.wait_exec(&exec_id).map_err(|e| e.to_string())
    });
    let tty = req.tty;
    let resize_fd = if tty { stdin_ours.try_clone().ok() } else { None };
    // Stdin goes through a bounded channel to a writer thread: a process that does not read
    // holds the client back instead of filling our memory. Dropping the sender closes stdin.
    let mut stdin: Option<mpsc::Sender<Vec<u8>>> = None;
    if req.stdin || tty {
        let (tx, mut rx) = mpsc::channel::<Vec<u8>>(16);
        let mut file = std::fs::File::from(stdin_ours);
        std::thread::spawn(move || {
            while let Some(chunk) = rx.blocking_recv() {
                if file.write_all(&chunk).is_err() {
                    return;
                }
            }
        });
        stdin = Some(tx);
    } else {
        drop(stdin_ours);
    }
    let mut waiter = std::pin::pin!(waiter);
    let code = loop {
        tokio::select! {
            done = &mut waiter => break done.map_err(|e| e.to_string()).and_then(|r| r),
            m = rd.next() => match m {
                Ok((0..=2, payload)) => match payload.split_first() {
                    Some((&STDIN, data)) => {
                        if let Some(w) = stdin.as_ref() {
                            let _ = w.send(data.to_vec()).await;
                        }
                    }
                    Some((&RESIZE, data)) => {
                        if let (Some(fd), Ok(size)) = (resize_fd.as_ref(), serde_json::from_slice::<serde_json::Value>(data)) {
                            let dim = |k: &str| u16::try_from(size[k].as_u64().unwrap_or(0)).unwrap_or(u16::MAX);
                            let _ = runtime::pty::set_window_size(fd.as_fd(), dim("Width"), dim("Height"));
                        }
                    }
                    Some((&CLOSE, [STDIN])) if !tty => stdin = None,
                    _ => {}
                },
                Ok((9, payload)) => {
                    let _ = out.send(frame(10, &payload)).await;
                }
                Ok((8, _)) | Err(_) => {
                    // The client left: close everything of ours; the process sees EOF, a broken
                    // pipe or a hangup. Its exit is no longer awaited.
                    for p in &pumps {
                        p.abort();
                    }
                    return None;
                }
                Ok(_) => {}
            },
        }
    };
    drop((stdin, resize_fd));
    for p in pumps {
        let abort = p.abort_handle();
        if tokio::time::timeout(DRAIN, p).await.is_err() {
            abort.abort();
        }
    }
    Some(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_key_matches_rfc_6455() {
        assert_eq!(
            accept_key("dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    #[test]
    fn parses_kubectl_queries() {
        let r = ExecRequest::parse(Some(
            "command=sh&command=-c&command=echo+hi%3B+exit+3&container=main&stderr=true&stdout=true",
        ))
        .expect("valid");
        assert_eq!(r.command, ["sh", "-c", "echo hi; exit 3"]);
        assert!(r.stdout && r.stderr && !r.stdin && !r.tty);
        assert!(ExecRequest::parse(Some("stdout=true")).is_err());
    }

    #[test]
    fn frames_round_trip() {
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("rt");
        rt.block_on(async {
            // A masked client frame on channel 0.
            let payload = b"\x00hello";
            let mask = [1u8, 2, 3, 4];
            let mut wire = vec![0x82, 0x80 | payload.len() as u8];
            wire.extend_from_slice(&mask);
            wire.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
            let f = read_frame(&mut &wire[..]).await.expect("frame");
            assert_eq!((f.opcode, f.payload.as_slice()), (2, &payload[..]));
            // A fragmented stdin message with a ping between its fragments.
            let mut wire = vec![0x02, 3, STDIN, b'a', b'b'];
            wire.extend([0x89, 1, b'p']);
            wire.extend([0x80, 2, b'c', b'd']);
            let mut m = MessageReader {
                inner: &wire[..],
                partial: None,
            };
            assert_eq!(m.next().await.expect("ping"), (9, b"p".to_vec()));
            assert_eq!(
                m.next().await.expect("message"),
                (2, vec![STDIN, b'a', b'b', b'c', b'd'])
            );
            assert!(m.next().await.is_err(), "end of input");
            let mut stray = MessageReader {
                inner: &[0x80u8, 1, b'x'][..],
                partial: None,
            };
            assert!(stray.next().await.is_err(), "a continuation without a message");
            // Server frames: 7-bit, 16-bit and 64-bit lengths.
            for n in [5usize, 300, 70_000] {
                let data = vec![7u8; n];
                let wire = channel_frame(STDOUT, &data);
                let f = read_frame(&mut &wire[..]).await.expect("frame");
                assert_eq!(f.payload.len(), n + 1);
                assert_eq!(f.payload[0], STDOUT);
            }
        });
    }

    #[test]
    fn exit_status_for_kubectl() {
        assert_eq!(status(Ok(0))["status"], "Success");
        let s = status(Ok(3));
        assert_eq!(s["reason"], "NonZeroExitCode");
        assert_eq!(
            s["details"]["causes"][0],
            json!({"reason": "ExitCode", "message": "3"})
        );
    }
}
