//! `/attach/<namespace>/<pod>/<container>`: `kubectl attach` over the exec protocol
//! (`v5.channel.k8s.io` and `v4` over WebSocket, `v4` over SPDY). The client gets the container's output from the moment it attaches,
//! stdout on channel 1 and stderr on channel 2, read from the container's log as the runtime
//! writes it (every byte the container writes goes there first), until the container stops;
//! then a `Success` status, and kubectl exits.
//!
//! A container with `stdin: true` reads what the client sends on channel 0 (the runtime hands
//! out its stdin pipe, or with `tty: true` its terminal, through `Attach`); with `stdinOnce`
//! the first client's stdin is the container's, and its close is the container's EOF. Channel 4
//! resizes the terminal. For a container without stdin, what the client sends is read and
//! dropped, as upstream does. A terminal's output is the log's stdout, written as it comes
//! (prompts and echo included, see the runtime's log writer).

use std::os::fd::OwnedFd;
use std::path::PathBuf;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

use crate::exec::{self, Channels, ExecRequest, Transport};
use crate::logs::Record;

/// The channel and bytes of each complete record in `lines` that the client asked for.
fn output(lines: &str, req: &ExecRequest) -> Vec<(u8, Bytes)> {
    lines
        .lines()
        .filter_map(Record::parse)
        .filter_map(|r| {
            let channel = match r.stream {
                "stdout" if req.stdout => exec::STDOUT,
                "stderr" if req.stderr => exec::STDERR,
                _ => return None,
            };
            let mut text = r.text.as_bytes().to_vec();
            if r.tag == "F" {
                text.push(b'\n');
            }
            Some((channel, Bytes::from(text)))
        })
        .collect()
}

/// The container's input from the runtime, when the client sends some: (tty, input).
async fn input(id: String, req: &ExecRequest) -> (bool, Option<OwnedFd>) {
    if !req.stdin && !req.tty {
        return (false, None);
    }
    let got = tokio::task::spawn_blocking(move || {
        exec::runtime_client()?.attach(&id).map_err(exec::ExecError::from)
    })
    .await
    .map_err(exec::ExecError::from)
    .and_then(|r| r);
    match got {
        Ok(a) => (a.tty, a.input),
        Err(e) => {
            tracing::debug!(error = %e, "no input for the attach");
            (false, None)
        }
    }
}

/// Serves one attach session on `io` to container `id`: the output appended to `log` from now
/// on, and the client's input into the container's stdin if it has one.
pub async fn serve<S>(io: S, transport: Transport, id: String, log: PathBuf, req: ExecRequest)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let Some(mut ch) = Channels::open(io, transport, &req).await else {
        return;
    };
    let (tty, input) = input(id, &req).await;
    let resize = input.as_ref().filter(|_| tty).and_then(|fd| fd.try_clone().ok());
    let mut stdin = input.filter(|_| req.stdin).map(exec::stdin_writer);
    // Attached now: what the log holds already is history (`kubectl logs` shows it).
    let offset = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    let (tx, mut batches) = mpsc::channel(16);
    let wanted = req.clone();
    let follower = tokio::spawn(crate::server::follow(log, offset, tx, move |lines| {
        let out = output(lines, &wanted);
        (!out.is_empty()).then_some(out)
    }));
    let ended = 'session: loop {
        tokio::select! {
            batch = batches.recv() => match batch {
                Some(batch) => {
                    for (channel, data) in batch {
                        if ch.out.send(exec::channel_message(channel, &data)).await.is_err() {
                            break 'session None;
                        }
                    }
                }
                // The container stopped (or its log went away).
                None => break Some(Ok(0)),
            },
            msg = ch.messages.next() => match msg {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => break None,
                Some(Ok(Message::Binary(data))) => exec::on_channel(data, &mut stdin, resize.as_ref(), tty).await,
                Some(Ok(Message::Text(text))) => {
                    exec::on_channel(Bytes::from(text), &mut stdin, resize.as_ref(), tty).await
                }
                Some(Ok(_)) => {}
            },
        }
    };
    follower.abort();
    tracing::debug!(container_stopped = ended.is_some(), "attach ended");
    ch.finish(ended).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_go_to_the_channels_asked_for() {
        let lines = "2026-12-02T05:00:00.000000000Z stdout F hello\n\
                     2026-12-02T05:00:00.100000000Z stderr F oops\n\
                     2026-12-02T05:00:00.200000000Z stdout P par\n\
                     2026-12-02T05:00:00.300000000Z stdout F tial\n\
                     not a record\n";
        let both = ExecRequest {
            stdout: true,
            stderr: true,
            ..ExecRequest::default()
        };
        let got: Vec<(u8, String)> = output(lines, &both)
            .into_iter()
            .map(|(c, b)| (c, String::from_utf8_lossy(&b).into_owned()))
            .collect();
        assert_eq!(
            got,
            vec![
                (exec::STDOUT, "hello\n".into()),
                (exec::STDERR, "oops\n".into()),
                (exec::STDOUT, "par".into()),
                (exec::STDOUT, "tial\n".into()),
            ]
        );
        let only_out = ExecRequest {
            stdout: true,
            ..ExecRequest::default()
        };
        assert_eq!(output(lines, &only_out).len(), 3);
        assert!(output(lines, &ExecRequest::default()).is_empty());
    }
}
