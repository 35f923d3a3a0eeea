//! HTTP answer pacing: a deadline each write re-arms (design.md §5.1, the body
//! timeout on answers).
//!
//! An answer that holds bytes in a server's budget of bytes in memory (a session's
//! file, an MCP tool's answer) must not hold them for as long as a client cares not to
//! read. The server makes one [`AnswerDeadline`] per connection and puts it in each
//! request's extensions; such an answer arms it as its bytes go (a [`Paced`] body arms
//! it for each piece it hands on), the connection's own loop puts it off while the
//! client acknowledges more bytes, and closes the connection once it passes, which
//! drops the answer and gives its bytes back.
//!
//! Both the HTTP API's session downloads and `/mcp`'s answers pace this way; neither
//! owns the rule.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::Body;
use tokio::time::Instant;

/// A connection's deadline for progress on an answer that holds bytes in the server's
/// budget of bytes in memory. The server makes one per connection, with its body
/// timeout, and puts it in each request's extensions. Such an answer arms it again as
/// its frames are made (a session's file goes through a [`Paced`] body, in pieces), the
/// server puts it off while the client acknowledges more bytes, and a connection whose
/// client takes nothing for that long is closed, which gives the holds back. So a
/// client that stops reading holds its share of the budget for at most that long, as
/// one that stops sending a body does, while one that reads steadily, however slowly,
/// is served.
#[derive(Clone, Debug)]
pub struct AnswerDeadline {
    within: Duration,
    /// The armed instant, with the arming it belongs to.
    at: Arc<tokio::sync::watch::Sender<Option<(u64, Instant)>>>,
    armings: Arc<AtomicU64>,
}

impl AnswerDeadline {
    /// A deadline `within` from each time it is armed.
    pub fn new(within: Duration) -> AnswerDeadline {
        AnswerDeadline {
            within,
            at: Arc::new(tokio::sync::watch::Sender::new(None)),
            armings: Arc::default(),
        }
    }

    /// How long after an arming (or an extension) it passes.
    pub fn within(&self) -> Duration {
        self.within
    }

    /// Armed from now until the guard drops (the answer's bytes are sent and dropped).
    pub fn arm(&self) -> ArmedDeadline {
        let id = self.armings.fetch_add(1, Ordering::Relaxed);
        self.at
            .send_replace(Some((id, Instant::now() + self.within)));
        ArmedDeadline {
            deadline: self.clone(),
            id,
        }
    }

    /// Moves the armed deadline to `within` from now (the connection made progress the
    /// arming could not see: bytes the kernel had buffered were taken).
    pub fn extend(&self) {
        let at = Instant::now() + self.within;
        self.at.send_modify(|armed| {
            if let Some((_, when)) = armed {
                *when = at;
            }
        });
    }

    /// Returns once an armed deadline passes (never while none is armed).
    pub async fn passed(&self) {
        let mut watched = self.at.subscribe();
        loop {
            let armed = *watched.borrow_and_update();
            let changed = match armed {
                Some((id, when)) => tokio::select! {
                    () = tokio::time::sleep_until(when) => {
                        if *self.at.borrow() == Some((id, when)) {
                            return;
                        }
                        continue;
                    }
                    changed = watched.changed() => changed,
                },
                None => watched.changed().await,
            };
            if changed.is_err() {
                return std::future::pending().await;
            }
        }
    }
}

/// The armed deadline of one answer, shared by its [`Paced`] body (which arms it again
/// as pieces go) and its bytes' owner (which keeps it armed until the last bytes sent
/// are dropped, after the body is done).
pub type DeadlineSlot = Arc<Mutex<Option<ArmedDeadline>>>;

/// How much of an answer goes at a time: the deadline is armed again for each piece.
const PIECE: usize = 256 * 1024;

/// A body whose data goes in pieces of at most [`PIECE`] bytes (slices of the same
/// buffers, nothing copied), each taken re-arming `deadline` in `slot` while `arm`
/// says the answer holds bytes. Dropping it leaves the slot as it is: whoever owns the
/// bytes still being written keeps the last arming until they are dropped.
pub struct Paced<B> {
    inner: B,
    pending: Bytes,
    deadline: AnswerDeadline,
    slot: DeadlineSlot,
    arm: Box<dyn Fn() -> bool + Send + Sync>,
}

impl<B> std::fmt::Debug for Paced<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Paced")
            .field("pending", &self.pending.len())
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl<B> Paced<B> {
    pub fn new(
        inner: B,
        deadline: AnswerDeadline,
        slot: DeadlineSlot,
        arm: Box<dyn Fn() -> bool + Send + Sync>,
    ) -> Paced<B> {
        Paced {
            inner,
            pending: Bytes::new(),
            deadline,
            slot,
            arm,
        }
    }

    fn rearm(&self) {
        if (self.arm)() {
            let armed = self.deadline.arm();
            *self.slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(armed);
        }
    }
}

impl<B> Body for Paced<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, B::Error>>> {
        loop {
            if !self.pending.is_empty() {
                let take = self.pending.len().min(PIECE);
                let piece = self.pending.split_to(take);
                self.rearm();
                return Poll::Ready(Some(Ok(http_body::Frame::data(piece))));
            }
            match std::pin::Pin::new(&mut self.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => self.pending = data,
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
                other => return other,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.pending.is_empty() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        let mut hint = self.inner.size_hint();
        let pending = self.pending.len() as u64;
        hint.set_lower(hint.lower().saturating_add(pending));
        if let Some(upper) = hint.upper() {
            hint.set_upper(upper.saturating_add(pending));
        }
        hint
    }
}

/// An armed [`AnswerDeadline`]; dropped, it is disarmed (unless armed again since).
#[derive(Debug)]
pub struct ArmedDeadline {
    deadline: AnswerDeadline,
    id: u64,
}

impl Drop for ArmedDeadline {
    fn drop(&mut self) {
        self.deadline.at.send_if_modified(|armed| {
            let ours = armed.is_some_and(|(id, _)| id == self.id);
            if ours {
                *armed = None;
            }
            ours
        });
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::{BodyExt, Full};

    use super::*;

    const WITHIN: Duration = Duration::from_secs(10);

    /// Whether `deadline` passes within `wait` (on the test's paused clock).
    async fn passes_within(deadline: &AnswerDeadline, wait: Duration) -> bool {
        tokio::time::timeout(wait, deadline.passed()).await.is_ok()
    }

    /// Never armed, it never passes.
    #[tokio::test(start_paused = true)]
    async fn an_unarmed_deadline_never_passes() {
        let deadline = AnswerDeadline::new(WITHIN);
        assert!(!passes_within(&deadline, WITHIN * 10).await);
    }

    /// Armed, it passes `within` after the arming, not before.
    #[tokio::test(start_paused = true)]
    async fn an_armed_deadline_passes_within_after_its_arming() {
        let deadline = AnswerDeadline::new(WITHIN);
        let start = Instant::now();
        let _armed = deadline.arm();
        deadline.passed().await;
        assert_eq!(start.elapsed(), WITHIN);
    }

    /// Dropping the arming disarms it, while it is being waited on too.
    #[tokio::test(start_paused = true)]
    async fn a_dropped_arming_disarms() {
        let deadline = AnswerDeadline::new(WITHIN);
        let armed = deadline.arm();
        let waiter = {
            let deadline = deadline.clone();
            tokio::spawn(async move { passes_within(&deadline, WITHIN * 10).await })
        };
        tokio::time::sleep(WITHIN / 2).await;
        drop(armed);
        assert!(!waiter.await.unwrap());
    }

    /// A later arming moves the deadline, and dropping an earlier one leaves it armed.
    #[tokio::test(start_paused = true)]
    async fn a_later_arming_wins_over_an_earlier_one() {
        let deadline = AnswerDeadline::new(WITHIN);
        let start = Instant::now();
        let first = deadline.arm();
        tokio::time::sleep(WITHIN / 2).await;
        let _second = deadline.arm();
        drop(first);
        deadline.passed().await;
        assert_eq!(start.elapsed(), WITHIN / 2 + WITHIN);
    }

    /// An extension moves an armed deadline to `within` from now; unarmed, it arms
    /// nothing.
    #[tokio::test(start_paused = true)]
    async fn an_extension_moves_only_an_armed_deadline() {
        let deadline = AnswerDeadline::new(WITHIN);
        deadline.extend();
        assert!(!passes_within(&deadline, WITHIN * 2).await);

        let start = Instant::now();
        let _armed = deadline.arm();
        tokio::time::sleep(WITHIN - Duration::from_secs(1)).await;
        deadline.extend();
        deadline.passed().await;
        assert_eq!(start.elapsed(), WITHIN * 2 - Duration::from_secs(1));
    }

    /// A paced body hands its data on in pieces of at most [`PIECE`] bytes, the same
    /// bytes in the same order, each arming the deadline while `arm` says so; the last
    /// arming stays in the slot after the body is dropped.
    #[tokio::test(start_paused = true)]
    async fn a_paced_body_goes_in_pieces_each_arming_the_deadline() {
        let data: Vec<u8> = (0..PIECE * 2 + 1000).map(|i| (i % 251) as u8).collect();
        let deadline = AnswerDeadline::new(WITHIN);
        let slot = DeadlineSlot::default();
        let mut body = Paced::new(
            Full::new(Bytes::from(data.clone())),
            deadline.clone(),
            slot.clone(),
            Box::new(|| true),
        );
        assert_eq!(body.size_hint().exact(), Some(data.len() as u64));
        let mut pieces = Vec::new();
        while let Some(frame) = body.frame().await {
            pieces.push(frame.unwrap().into_data().unwrap());
            assert!(
                slot.lock().unwrap().is_some(),
                "a piece did not arm the deadline"
            );
        }
        assert!(body.is_end_stream());
        let sizes: Vec<usize> = pieces.iter().map(Bytes::len).collect();
        assert_eq!(sizes, [PIECE, PIECE, 1000]);
        assert_eq!(pieces.concat(), data);
        drop(body);
        let start = Instant::now();
        deadline.passed().await;
        assert_eq!(start.elapsed(), WITHIN);

        slot.lock().unwrap().take();
        assert!(!passes_within(&deadline, WITHIN * 2).await);
    }

    /// While `arm` says the answer holds nothing, its pieces arm nothing.
    #[tokio::test(start_paused = true)]
    async fn a_paced_body_that_holds_nothing_arms_nothing() {
        let deadline = AnswerDeadline::new(WITHIN);
        let slot = DeadlineSlot::default();
        let body = Paced::new(
            Full::new(Bytes::from(vec![7u8; PIECE + 1])),
            deadline.clone(),
            slot.clone(),
            Box::new(|| false),
        );
        let all = body.collect().await.unwrap().to_bytes();
        assert_eq!(all.len(), PIECE + 1);
        assert!(slot.lock().unwrap().is_none());
        assert!(!passes_within(&deadline, WITHIN * 2).await);
    }
}
