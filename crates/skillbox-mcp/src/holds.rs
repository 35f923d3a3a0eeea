//! What an answer to a `/mcp` POST holds in the server's budget of bytes in memory, and
//! how long: the holds of its tool calls ride along with the response's frames until
//! the server drops the last bytes it sent, and while any is held the frames arm the
//! connection's [`AnswerDeadline`] (`skillbox-pace`).

use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use http::Response;
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use skillbox_pace::{AnswerDeadline, DeadlineSlot};

use crate::door::Held;

/// What the calls of one POST hold in memory for their answers ([`Held`]), kept until
/// the response has sent them: a tool puts its hold here (it reaches the handler in
/// the request's parts), and each frame of the response body carries this along, so
/// the last hold goes when the server drops the last bytes it sent, not when the tool
/// returns (its answer is then still to be serialized and written). While it holds
/// any, the response's pieces arm the connection's [`AnswerDeadline`] as they go (from
/// the first one sent: the time the tool takes to read is not the client's).
#[derive(Clone, Default)]
pub(crate) struct AnswerHolds {
    holds: Arc<Mutex<Vec<Held>>>,
    /// The last arming, kept until the last frame's bytes are dropped.
    slot: DeadlineSlot,
}

impl AnswerHolds {
    pub(crate) fn keep(&self, held: Held) {
        self.holds
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(held);
    }

    fn holding_any(&self) -> bool {
        !self
            .holds
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    }
}

/// A frame's bytes, with the holds of the answer they are part of.
struct HeldFrame {
    bytes: Bytes,
    _holds: AnswerHolds,
}

impl AsRef<[u8]> for HeldFrame {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

/// `response` whose body keeps `holds` until it is done, and each of whose frames
/// keeps them until its bytes are dropped. With a `deadline`, each data frame made
/// while the answer holds bytes arms it again (the last arming is kept with the holds
/// until the last bytes are dropped): the clock starts when the answer is ready to go,
/// not while the tool reads, and the connection's own check extends it while the
/// client takes what the kernel buffered.
pub(crate) fn holding(
    response: Response<BoxBody<Bytes, Infallible>>,
    holds: AnswerHolds,
    deadline: Option<AnswerDeadline>,
) -> Response<BoxBody<Bytes, Infallible>> {
    response.map(|body| {
        body.map_frame(move |frame| {
            frame.map_data(|bytes| {
                if let Some(deadline) = &deadline
                    && holds.holding_any()
                {
                    let armed = deadline.arm();
                    *holds.slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(armed);
                }
                Bytes::from_owner(HeldFrame {
                    bytes,
                    _holds: holds.clone(),
                })
            })
        })
        .boxed()
    })
}
