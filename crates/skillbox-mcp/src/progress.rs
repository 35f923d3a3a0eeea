//! `notifications/progress` while an `exec` runs, for a client that asked for them (a
//! `progressToken` in the call's `_meta`). The command's output is collected as it
//! always is; a task of its own tells the client how long it has run, how many bytes
//! it printed and its last line, when output came (at most every [`MIN_GAP`]) and
//! otherwise every [`HEARTBEAT`], so a client that resets its timeout on progress
//! waits for a long, quiet command. `progress` is the seconds run, so it always
//! increases. A client that stops reading holds back only the reports, never the
//! command: the exec's output is read whatever happens to them.

use std::time::{Duration, Instant};

use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::{Peer, RoleServer};
use skillbox_env::CancellationToken;
use tokio::sync::watch;

/// The longest a running exec goes without a report.
pub(crate) const HEARTBEAT: Duration = Duration::from_secs(5);
/// The shortest time between two reports.
pub(crate) const MIN_GAP: Duration = Duration::from_millis(250);
/// The end of the output kept to find its last line in.
const TAIL_BYTES: usize = 4096;
/// The most of a last line a report shows.
const LINE_CHARS: usize = 160;

/// What the exec printed so far: its size and its end.
#[derive(Debug, Default)]
struct Seen {
    bytes: u64,
    tail: Vec<u8>,
}

impl Seen {
    fn add(&mut self, chunk: &[u8]) {
        self.bytes += chunk.len() as u64;
        let keep = chunk.len().min(TAIL_BYTES);
        self.tail.extend_from_slice(&chunk[chunk.len() - keep..]);
        if self.tail.len() > TAIL_BYTES {
            self.tail.drain(..self.tail.len() - TAIL_BYTES);
        }
    }

    /// The last line with something in it, control characters shown as spaces, cut
    /// to [`LINE_CHARS`].
    fn last_line(&self) -> Option<String> {
        let line = self
            .tail
            .split(|&b| b == b'\n')
            .rev()
            .map(|l| String::from_utf8_lossy(l).trim().to_string())
            .find(|l| !l.is_empty())?;
        let shown: String = line
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .take(LINE_CHARS)
            .collect();
        Some(if line.chars().count() > LINE_CHARS {
            format!("{shown}…")
        } else {
            shown
        })
    }

    fn message(&self, ran: Duration) -> String {
        let mut message = format!(
            "running for {:.1} s, {} bytes of output",
            ran.as_secs_f64(),
            self.bytes
        );
        if let Some(line) = self.last_line() {
            message.push_str(": ");
            message.push_str(&line);
        }
        message
    }
}

/// How long [`Reporter::finish`] lets a report being sent finish before it gives up
/// on it (a client that stopped reading).
const LAST_SEND_BOUND: Duration = Duration::from_secs(1);

/// Reports one exec's progress until [`finish`](Self::finish) (or until dropped).
pub(crate) struct Reporter {
    seen: watch::Sender<Seen>,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Reporter {
    pub(crate) fn start(peer: Peer<RoleServer>, token: ProgressToken) -> Reporter {
        let (seen, watching) = watch::channel(Seen::default());
        let stop = CancellationToken::new();
        let task = tokio::spawn(report(peer, token, watching, stop.clone(), Instant::now()));
        Reporter {
            seen,
            stop,
            task: Some(task),
        }
    }

    /// A chunk of output arrived.
    pub(crate) fn saw(&self, chunk: &[u8]) {
        self.seen.send_modify(|seen| seen.add(chunk));
    }

    /// Stops reporting. A report being sent is let finish (it was queued before the
    /// answer, and a send returns once it is written), for [`LAST_SEND_BOUND`] at most;
    /// none starts after.
    pub(crate) async fn finish(mut self) {
        self.stop.cancel();
        if let Some(mut task) = self.task.take()
            && tokio::time::timeout(LAST_SEND_BOUND, &mut task)
                .await
                .is_err()
        {
            task.abort();
        }
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

async fn report(
    peer: Peer<RoleServer>,
    token: ProgressToken,
    mut seen: watch::Receiver<Seen>,
    stop: CancellationToken,
    started: Instant,
) {
    loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            changed = seen.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            () = tokio::time::sleep(HEARTBEAT) => {}
        }
        let ran = started.elapsed();
        let message = seen.borrow_and_update().message(ran);
        let report =
            ProgressNotificationParam::new(token.clone(), ran.as_secs_f64()).with_message(message);
        if peer.notify_progress(report).await.is_err() {
            return;
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(MIN_GAP) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_shows_the_size_and_the_last_line_of_the_output() {
        let mut seen = Seen::default();
        assert_eq!(
            seen.message(Duration::from_millis(1500)),
            "running for 1.5 s, 0 bytes of output"
        );
        seen.add(b"step 1\nstep 2\n\n  \r\n");
        assert_eq!(
            seen.message(Duration::from_secs(2)),
            "running for 2.0 s, 19 bytes of output: step 2"
        );
        seen.add(b"downloading \x1b[32m50%\x1b[0m");
        assert_eq!(
            seen.last_line().as_deref(),
            Some("downloading  [32m50% [0m")
        );
        // Only the end is kept, and a long line is cut.
        seen.add(&vec![b'x'; 3 * TAIL_BYTES]);
        assert_eq!(seen.tail.len(), TAIL_BYTES);
        assert_eq!(seen.bytes, 19 + 24 + 3 * TAIL_BYTES as u64);
        let line = seen.last_line().unwrap();
        assert_eq!(line.chars().count(), LINE_CHARS + 1);
        assert!(line.ends_with('…'));
        // Bytes that are not UTF-8 are shown, not refused.
        seen.add(b"\nok \xff\xfe done\n");
        assert_eq!(
            seen.last_line().as_deref(),
            Some("ok \u{fffd}\u{fffd} done")
        );
    }
}
