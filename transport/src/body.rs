//! Response bodies: a whole buffer, or a stream fed from a channel (watch, logs, follow).

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

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

/// A streaming body whose data not yet taken by the client is bounded in bytes, for streams a
/// client may stop reading (watches): `send` waits while the queue is over `max_bytes` and
/// gives up with [`SendError::Slow`] when the client took nothing for `patience`, so the
/// stream can be dropped instead of holding memory for a reader that does not read. One chunk
/// larger than the budget still goes when the queue is empty.
///
/// `shared` bounds the sum over many such channels (a server's watches together): while the
/// sum is over its limit, a channel that still holds unread bytes waits as if its own budget
/// were full, so readers that keep up (nothing queued) are never held back by those that do
/// not, and the slow ones are the ones given up on.
pub fn budget_channel(
    max_bytes: usize,
    patience: Duration,
    shared: Arc<SharedBudget>,
) -> (BudgetSender, Body) {
    let (tx, rx) = mpsc::unbounded_channel();
    let budget = Arc::new(Budget {
        queued: AtomicUsize::new(0),
        drained: tokio::sync::Notify::new(),
        shared,
    });
    let body = BudgetBody {
        rx,
        budget: budget.clone(),
    };
    (
        BudgetSender {
            tx,
            budget,
            max_bytes,
            patience,
        },
        body.boxed(),
    )
}

struct Budget {
    /// Bytes sent and not yet taken by the body.
    queued: AtomicUsize,
    /// Signalled whenever the body takes a chunk.
    drained: tokio::sync::Notify,
    shared: Arc<SharedBudget>,
}

impl Drop for Budget {
    /// A stream dropped with unread bytes gives them back to the shared budget.
    fn drop(&mut self) {
        let left = *self.queued.get_mut();
        self.shared.queued.fetch_sub(left, Ordering::SeqCst);
    }
}

/// The limit on unread bytes over many [`budget_channel`]s together.
#[derive(Debug)]
pub struct SharedBudget {
    queued: AtomicUsize,
    max_bytes: usize,
}

impl SharedBudget {
    pub fn new(max_bytes: usize) -> Arc<Self> {
        Arc::new(Self {
            queued: AtomicUsize::new(0),
            max_bytes,
        })
    }

    /// Unread bytes over all its channels.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::SeqCst)
    }
}

/// Why a [`BudgetSender`] did not send.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("the client left")]
    Closed,
    #[error("the client took nothing for {patience:?} with {queued} bytes waiting")]
    Slow { patience: Duration, queued: usize },
}

/// The sending side of [`budget_channel`].
pub struct BudgetSender {
    tx: mpsc::UnboundedSender<Bytes>,
    budget: Arc<Budget>,
    max_bytes: usize,
    patience: Duration,
}

impl std::fmt::Debug for BudgetSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BudgetSender")
            .field("queued", &self.queued())
            .field("max_bytes", &self.max_bytes)
            .finish()
    }
}

impl BudgetSender {
    /// Queues `chunk` once the budget has room for it (see [`budget_channel`]).
    pub async fn send(&self, chunk: Bytes) -> Result<(), SendError> {
        let deadline = tokio::time::Instant::now() + self.patience;
        loop {
            // Created before the check, so a chunk taken in between still wakes it.
            let drained = self.budget.drained.notified();
            let queued = self.queued();
            let shared = &self.budget.shared;
            let fits = queued.saturating_add(chunk.len()) <= self.max_bytes
                && shared.queued().saturating_add(chunk.len()) <= shared.max_bytes;
            if queued == 0 || fits {
                break;
            }
            tokio::select! {
                _ = drained => {}
                _ = self.tx.closed() => return Err(SendError::Closed),
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(SendError::Slow { patience: self.patience, queued });
                }
            }
        }
        // Counted before it can be taken, so the body never subtracts what was not added.
        let len = chunk.len();
        self.budget.queued.fetch_add(len, Ordering::SeqCst);
        self.budget.shared.queued.fetch_add(len, Ordering::SeqCst);
        self.tx.send(chunk).map_err(|_| {
            self.budget.queued.fetch_sub(len, Ordering::SeqCst);
            self.budget.shared.queued.fetch_sub(len, Ordering::SeqCst);
            SendError::Closed
        })
    }

    /// Completes when the client has gone.
    pub async fn closed(&self) {
        self.tx.closed().await
    }

    /// Bytes sent and not yet taken by the client.
    pub fn queued(&self) -> usize {
        self.budget.queued.load(Ordering::SeqCst)
    }
}

struct BudgetBody {
    rx: mpsc::UnboundedReceiver<Bytes>,
    budget: Arc<Budget>,
}

impl hyper::body::Body for BudgetBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        let polled = self.rx.poll_recv(cx);
        if let Poll::Ready(Some(b)) = &polled {
            self.budget.queued.fetch_sub(b.len(), Ordering::SeqCst);
            self.budget.shared.queued.fetch_sub(b.len(), Ordering::SeqCst);
            self.budget.drained.notify_waiters();
        }
        polled.map(|o| o.map(|b| Ok(hyper::body::Frame::data(b))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_budget_channel_waits_for_room_and_gives_up_on_a_reader_that_stops() {
        let (tx, mut body) = budget_channel(10, Duration::from_secs(5), SharedBudget::new(1 << 20));
        // A chunk larger than the budget goes when nothing waits.
        tx.send(Bytes::from_static(b"0123456789ab")).await.expect("send");
        assert_eq!(tx.queued(), 12);
        // The next one waits until the reader takes the first.
        let reader = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let first = body.frame().await.expect("frame").expect("data");
            assert_eq!(first.into_data().expect("data").len(), 12);
            body
        };
        let (sent, mut body) = tokio::join!(tx.send(Bytes::from_static(b"abcdef")), reader);
        sent.expect("sent once there was room");
        tx.send(Bytes::from_static(b"ghij"))
            .await
            .expect("fits: 10 bytes");
        assert_eq!(tx.queued(), 10);
        // A reader that takes nothing more: the sender gives up after its patience.
        let t0 = tokio::time::Instant::now();
        match tx.send(Bytes::from_static(b"k")).await {
            Err(SendError::Slow { queued: 10, .. }) => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(t0.elapsed(), Duration::from_secs(5));
        // What was queued is still delivered, in order.
        let next = body.frame().await.expect("frame").expect("data");
        assert_eq!(&next.into_data().expect("data")[..], b"abcdef");
        drop(body);
        assert!(matches!(
            tx.send(Bytes::from_static(b"x")).await,
            Err(SendError::Closed)
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn the_shared_budget_holds_back_only_readers_that_fall_behind() {
        let shared = SharedBudget::new(10);
        let patience = Duration::from_secs(5);
        let (slow, slow_body) = budget_channel(100, patience, shared.clone());
        let (fast, mut fast_body) = budget_channel(100, patience, shared.clone());
        // The slow reader fills the shared budget (one chunk goes when its queue is empty).
        slow.send(Bytes::from_static(b"0123456789ab"))
            .await
            .expect("send");
        assert_eq!(shared.queued(), 12);
        // A reader that keeps up still gets every chunk, though the sum is over the limit.
        for _ in 0..3 {
            fast.send(Bytes::from_static(b"xyz"))
                .await
                .expect("nothing queued: goes");
            let got = fast_body.frame().await.expect("frame").expect("data");
            assert_eq!(&got.into_data().expect("data")[..], b"xyz");
        }
        // The slow one, with bytes unread and the sum over the limit, waits and is given up on,
        // though its own budget (100) has room.
        match slow.send(Bytes::from_static(b"c")).await {
            Err(SendError::Slow { queued: 12, .. }) => {}
            other => panic!("{other:?}"),
        }
        // Dropping it returns its unread bytes to the shared budget.
        drop((slow, slow_body));
        assert_eq!(shared.queued(), 0);
        fast.send(Bytes::from_static(b"a")).await.expect("send");
        fast.send(Bytes::from_static(b"b")).await.expect("fits again");
        assert_eq!(shared.queued(), 2);
    }

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
