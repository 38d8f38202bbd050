//! Response bodies: a whole buffer, or a stream fed from a channel (watch, logs, follow).

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use tokio::sync::mpsc;

/// A response body: a whole buffer or a stream.
pub type Body = BoxBody<Bytes, Infallible>;

/// A whole-buffer body.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    http_body_util::Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// An empty body.
pub fn empty() -> Body {
    full(Bytes::new())
}

/// A streaming body and the sender that feeds it: each message is one chunk; the body ends when
/// every sender is dropped. A sender notices a client that left through `closed()`.
pub fn channel(capacity: usize) -> (mpsc::Sender<Bytes>, Body) {
    let (tx, rx) = mpsc::channel(capacity);
    (tx, ChannelBody { rx }.boxed())
}

struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
}

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        self.rx
            .poll_recv(cx)
            .map(|o| o.map(|b| Ok(hyper::body::Frame::data(b))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn channel_body_yields_chunks_until_the_sender_is_dropped() {
        let (tx, body) = channel(4);
        tx.send(Bytes::from_static(b"a")).await.expect("send");
        tx.send(Bytes::from_static(b"bc")).await.expect("send");
        drop(tx);
        let all = body.collect().await.expect("collect").to_bytes();
        assert_eq!(&all[..], b"abc");
    }
}
