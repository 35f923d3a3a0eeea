//! Egress under gVisor (DESIGN.md §8): gVisor's network stack is its own, so a socket
//! skillbox makes in the container's network namespace is not on the sandbox's loopback.
//! Instead a bridge (`helpers/bridge.py`) runs in the container as root (the sandbox's
//! user can neither signal, trace nor write to it), listens on the sandbox's
//! `127.0.0.1:EGRESS_PORT`, and carries each connection as frames over its exec's stdin
//! and stdout; here each becomes a stream the sandbox's proxy serves, as if accepted
//! from a listener. No network is added to the container.
//!
//! The bridge decides nothing: every stream meets the proxy's rules, so frames are
//! read as untrusted (bounded, checked), and a bridge that misbehaves ends only its own
//! connections. Each direction of each stream has a window of [`WINDOW`] bytes: a side
//! sends no more than the other has granted (`credit` frames, sent as the bytes are
//! delivered), so one slow stream holds back only itself (as a socket's buffer would),
//! and what skillbox holds for a sandbox is bounded: [`MAX_STREAMS`] × [`WINDOW`] (a
//! frame counts at least 1 KiB), plus the duplex and read buffers of each.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bollard::container::LogOutput;
use futures_util::{Stream, StreamExt};
use skillbox_egress::Proxy;
use skillbox_egress::netns::EGRESS_PORT;
use skillbox_env::{CancellationToken, EnvResult};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::container::Container;
use crate::daemon::{Attach, Attached, start_attached, unavailable};

const BRIDGE_PY: &str = include_str!("helpers/bridge.py");

const HEADER: usize = 9;
/// The bridge sends at most 64 KiB a frame; a larger one is not the bridge's.
const MAX_FRAME: usize = 64 * 1024;
/// An open past them is closed at once (the proxy serves 64 at a time; the rest wait
/// for a slot, each within its window).
const MAX_STREAMS: usize = 128;
/// The bytes a side may send on a stream before the other grants more.
const WINDOW: u64 = 256 * 1024;
/// What a frame from the bridge counts against its window at least, so a window of tiny
/// frames is bounded too.
const MIN_COST: u64 = 1024;
/// How long the bridge may take to listen.
const READY_BOUND: Duration = Duration::from_secs(15);

const READY: u8 = 0;
const OPEN: u8 = 1;
const DATA: u8 = 2;
const EOF: u8 = 3;
const CLOSE: u8 = 4;
/// Payload: a u32, the bytes the sender delivered (the other side may send them again).
const CREDIT: u8 = 5;

fn frame(id: u32, kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(HEADER + payload.len());
    frame.extend_from_slice(&id.to_be_bytes());
    frame.push(kind);
    frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}

fn credit(id: u32, n: u64) -> Vec<u8> {
    frame(
        id,
        CREDIT,
        &(n.min(u64::from(u32::MAX)) as u32).to_be_bytes(),
    )
}

/// What a data frame of `len` bytes from the bridge counts against its window.
fn cost(len: usize) -> u64 {
    (len as u64).max(MIN_COST)
}

/// The frames in the bridge's output, as it comes in pieces.
#[derive(Default)]
struct Decoder {
    buf: Vec<u8>,
    /// Where the next frame starts in `buf` (what is before it was taken).
    at: usize,
}

impl Decoder {
    fn feed(&mut self, bytes: &[u8]) {
        // Compact once a piece, not once a frame.
        self.buf.drain(..self.at);
        self.at = 0;
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole frame (id, kind, payload), if there is one; an error for what no
    /// bridge sends.
    fn next(&mut self) -> Result<Option<(u32, u8, Vec<u8>)>, String> {
        let Some(head) = self.buf.get(self.at..self.at + HEADER) else {
            return Ok(None);
        };
        let id = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
        let kind = head[4];
        let len = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) as usize;
        if kind > CREDIT {
            return Err(format!("a frame of kind {kind}"));
        }
        if len > MAX_FRAME {
            return Err(format!("a frame of {len} bytes"));
        }
        let start = self.at + HEADER;
        let Some(payload) = self.buf.get(start..start + len) else {
            return Ok(None);
        };
        let payload = payload.to_vec();
        self.at = start + len;
        Ok(Some((id, kind, payload)))
    }
}

/// The bytes a side may still send on a stream, and a wake-up when it may send more.
struct Window {
    left: std::sync::atomic::AtomicU64,
    more: tokio::sync::Notify,
}

impl Window {
    fn open() -> Window {
        Window {
            left: std::sync::atomic::AtomicU64::new(WINDOW),
            more: tokio::sync::Notify::new(),
        }
    }

    fn grant(&self, n: u64) {
        let _ = self
            .left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                Some(left.saturating_add(n).min(WINDOW))
            });
        self.more.notify_one();
    }

    /// Waits until something may be sent: how much.
    async fn wait(&self) -> u64 {
        loop {
            let more = self.more.notified();
            let left = self.left.load(Ordering::SeqCst);
            if left > 0 {
                return left;
            }
            more.await;
        }
    }

    fn spend(&self, n: u64) {
        let _ = self
            .left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                Some(left.saturating_sub(n))
            });
    }
}

/// A stream as the frames from the bridge see it.
struct Entry {
    inbound: mpsc::UnboundedSender<Inbound>,
    /// What the bridge sent and the proxy has not taken yet (by [`cost`]); past
    /// [`WINDOW`] the bridge broke the protocol.
    unacked: Arc<std::sync::atomic::AtomicU64>,
    /// What skillbox may still send to the bridge on it.
    window: Arc<Window>,
}

/// What the bridge says of one stream.
enum Inbound {
    Data(Vec<u8>),
    Eof,
}

/// Starts the bridge in `container` and serves what it carries with `proxy`, until the
/// container goes; returns once the bridge listens (before any of the sandbox's code
/// runs), or `unavailable` if it does not.
pub(crate) async fn attach(container: &Container, proxy: Proxy) -> EnvResult<()> {
    let backend = container.runtime.backend();
    let what = "start the egress bridge";
    let argv = vec![
        container.runtime.python().to_string(),
        "-I".into(),
        "-S".into(),
        "-c".into(),
        BRIDGE_PY.into(),
        EGRESS_PORT.to_string(),
    ];
    let attach = Attach {
        argv,
        stdin: true,
        user: Some("0"),
        output_capacity: None,
    };
    let Attached {
        mut output, input, ..
    } = start_attached(&container.docker, &container.id, backend, what, attach).await?;
    let mut decoder = Decoder::default();
    let mut stderr = Vec::new();
    let ready = tokio::time::timeout(READY_BOUND, async {
        loop {
            match output.next().await {
                Some(Ok(LogOutput::StdOut { message })) => {
                    decoder.feed(&message);
                    match decoder.next() {
                        Ok(Some((0, READY, pid))) => {
                            return std::str::from_utf8(&pid)
                                .ok()
                                .and_then(|p| p.parse::<u32>().ok())
                                .filter(|&p| p > 1)
                                .ok_or_else(|| "it sent no pid".to_string());
                        }
                        Ok(Some(_)) => return Err("it spoke before it listened".to_string()),
                        Ok(None) => {}
                        Err(e) => return Err(e),
                    }
                }
                Some(Ok(LogOutput::StdErr { message })) => {
                    if stderr.len() < 4096 {
                        stderr.extend_from_slice(&message);
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.to_string()),
                None => return Err("it ended".to_string()),
            }
        }
    })
    .await;
    match ready {
        Ok(Ok(pid)) => container
            .bridge_pid
            .store(pid, std::sync::atomic::Ordering::SeqCst),
        Ok(Err(why)) => {
            return Err(unavailable(format!(
                "egress: the bridge in the gvisor sandbox did not start ({why}): {}",
                String::from_utf8_lossy(&stderr).trim()
            )));
        }
        Err(_) => {
            return Err(unavailable(format!(
                "egress: the bridge in the gvisor sandbox did not listen within {READY_BOUND:?}"
            )));
        }
    }
    tokio::spawn(serve(
        output,
        input,
        decoder,
        proxy,
        container.shutdown.clone(),
    ));
    Ok(())
}

/// Carries the bridge's streams to `proxy` until the bridge or the container ends.
async fn serve<O, I>(
    mut output: O,
    mut input: I,
    mut decoder: Decoder,
    proxy: Proxy,
    until: CancellationToken,
) where
    O: Stream<Item = Result<LogOutput, bollard::errors::Error>> + Unpin,
    I: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    // Bounded by the windows: each stream sends at most WINDOW bytes and a few control
    // frames before the bridge answers.
    let (to_bridge, mut frames) = mpsc::unbounded_channel::<Vec<u8>>();
    let writer = tokio::spawn(async move {
        while let Some(frame) = frames.recv().await {
            if input.write_all(&frame).await.is_err() {
                break;
            }
        }
    });
    let mut streams: HashMap<u32, Entry> = HashMap::new();
    let ended = 'serving: loop {
        loop {
            let (id, kind, payload) = match decoder.next() {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(why) => break 'serving format!("it sent what no bridge sends ({why})"),
            };
            match kind {
                OPEN => {
                    streams.retain(|_, s| !s.inbound.is_closed());
                    if streams.contains_key(&id)
                        || streams.len() >= MAX_STREAMS
                        || proxy.is_stopped()
                    {
                        let _ = to_bridge.send(frame(id, CLOSE, &[]));
                        continue;
                    }
                    let (ours, theirs) = tokio::io::duplex(64 * 1024);
                    proxy.spawn(theirs);
                    let (tx, rx) = mpsc::unbounded_channel();
                    let entry = Entry {
                        inbound: tx,
                        unacked: Arc::default(),
                        window: Arc::new(Window::open()),
                    };
                    tokio::spawn(stream(
                        id,
                        ours,
                        rx,
                        entry.unacked.clone(),
                        entry.window.clone(),
                        to_bridge.clone(),
                    ));
                    streams.insert(id, entry);
                }
                DATA | EOF => {
                    let Some(entry) = streams.get(&id) else {
                        continue;
                    };
                    let message = if kind == DATA {
                        let owed = entry
                            .unacked
                            .fetch_add(cost(payload.len()), Ordering::SeqCst)
                            + cost(payload.len());
                        if owed > WINDOW {
                            break 'serving format!("it sent past stream {id}'s window");
                        }
                        Inbound::Data(payload)
                    } else {
                        Inbound::Eof
                    };
                    if entry.inbound.send(message).is_err() {
                        streams.remove(&id);
                    }
                }
                CLOSE => {
                    streams.remove(&id);
                }
                CREDIT => {
                    let (Some(entry), Ok(n)) = (streams.get(&id), <[u8; 4]>::try_from(payload))
                    else {
                        continue;
                    };
                    entry.window.grant(u64::from(u32::from_be_bytes(n)));
                }
                _ => {}
            }
        }
        let next = tokio::select! {
            () = until.cancelled() => break String::new(),
            next = output.next() => next,
        };
        match next {
            Some(Ok(LogOutput::StdOut { message })) => decoder.feed(&message),
            Some(Ok(_)) => {}
            Some(Err(e)) => break format!("its output failed ({e})"),
            None => break "it ended".to_string(),
        }
    };
    if !until.is_cancelled() {
        // Less network than asked from here on (never more): say so.
        tracing::warn!(why = %ended, "egress: the gvisor sandbox's bridge stopped; its connections end");
    }
    drop(streams);
    writer.abort();
}

/// One connection: what the proxy sends goes to the bridge within the window the
/// bridge grants; what the bridge sends goes to the proxy, granted back as it is
/// taken; each way on its own (neither waits for the other), until both ends are done
/// or the bridge closes it. Closed towards the bridge when it ends.
async fn stream(
    id: u32,
    ours: tokio::io::DuplexStream,
    mut inbound: mpsc::UnboundedReceiver<Inbound>,
    unacked: Arc<std::sync::atomic::AtomicU64>,
    window: Arc<Window>,
    to_bridge: mpsc::UnboundedSender<Vec<u8>>,
) {
    let (mut from_proxy, mut to_proxy) = tokio::io::split(ours);
    let up = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let may = window.wait().await;
            let room = buf.len().min(usize::try_from(may).unwrap_or(usize::MAX));
            match from_proxy.read(&mut buf[..room]).await {
                Ok(0) | Err(_) => {
                    let _ = to_bridge.send(frame(id, EOF, &[]));
                    return;
                }
                Ok(n) => {
                    window.spend(n as u64);
                    if to_bridge.send(frame(id, DATA, &buf[..n])).is_err() {
                        return;
                    }
                }
            }
        }
    };
    tokio::pin!(up);
    let mut up_done = false;
    // Until the bridge's side ends: `true` when it closed the stream (or went away).
    let closed = {
        let down = async {
            while let Some(message) = inbound.recv().await {
                match message {
                    Inbound::Data(bytes) => {
                        if to_proxy.write_all(&bytes).await.is_err() {
                            return false;
                        }
                        let taken = cost(bytes.len());
                        unacked.fetch_sub(taken, Ordering::SeqCst);
                        let _ = to_bridge.send(credit(id, taken));
                    }
                    Inbound::Eof => {
                        let _ = to_proxy.shutdown().await;
                        return false;
                    }
                }
            }
            true
        };
        tokio::pin!(down);
        loop {
            tokio::select! {
                () = &mut up, if !up_done => up_done = true,
                closed = &mut down => break closed,
            }
        }
    };
    if !closed && !up_done {
        // The bridge's side is done: what the proxy still sends goes on, unless the
        // bridge closes the stream.
        let closing = async { while inbound.recv().await.is_some() {} };
        tokio::select! {
            () = &mut up => {}
            () = closing => {}
        }
    }
    if !closed {
        let _ = to_bridge.send(frame(id, CLOSE, &[]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_decoded_across_pieces_and_bad_ones_refused() {
        let mut decoder = Decoder::default();
        let mut bytes = frame(7, DATA, b"hello");
        bytes.extend(frame(7, EOF, &[]));
        for piece in bytes.chunks(4) {
            decoder.feed(piece);
        }
        assert_eq!(decoder.next().unwrap(), Some((7, DATA, b"hello".to_vec())));
        assert_eq!(decoder.next().unwrap(), Some((7, EOF, Vec::new())));
        assert_eq!(decoder.next().unwrap(), None);

        let mut huge = Decoder::default();
        huge.feed(&frame(1, DATA, &[])[..5]);
        huge.feed(&((MAX_FRAME as u32) + 1).to_be_bytes());
        assert!(huge.next().unwrap_err().contains("bytes"));
        let mut odd = Decoder::default();
        odd.feed(&frame(1, 9, b"x"));
        assert!(odd.next().unwrap_err().contains("kind 9"));
    }
}
