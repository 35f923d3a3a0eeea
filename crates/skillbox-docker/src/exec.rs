//! Running the caller's command in a docker sandbox: under skillbox's exec wrapper
//! (`helpers/exec.pl`), one at a time, its output streamed and capped while a timeout,
//! a cancel or the container's death may end it; what it leaves running is killed
//! before the next exec. How it ended becomes an `ExecOutput` in `outcome.rs`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::Ordering;
use std::time::Instant;

use async_trait::async_trait;
use bollard::container::LogOutput;
use bytes::Bytes;
use futures_util::StreamExt;
use skillbox_env::{
    CancellationToken, EnvError, EnvResult, ErrorCode, ExecEvent, ExecRequest, ExecStream, Shell,
    Truncated,
};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use crate::connect::DockerConnector;
use crate::container::Container;
use crate::daemon::{Attach, Attached, op_error, start_attached};
use crate::outcome::{
    ExecEnd, Kill, MAX_INPUTS, Measured, Seen, Status, StatusKey, outcome, split_status,
};
use crate::reset::{kill_all, settle};
use crate::runtime::{NR_EXIT_GROUP, NR_PRCTL, NR_SECCOMP, walkread_args};
use crate::sandbox::{DockerSandbox, WalkAhead};

/// The exec wrapper, with the walk it makes after its command (helpers/walk.pl).
const EXEC_PL: &str = concat!(
    include_str!("helpers/exec.pl"),
    include_str!("helpers/walk.pl")
);
/// Bytes of stderr held back until the end, where the wrapper's status line is.
const HOLD_BACK: usize = 128;
/// What starts the frame in which the wrapper sends a walk announced with the exec
/// (`walk_after`): `MARKER <length> LF <the file helper's walkread output>`, right
/// before the status line (see helpers/exec.pl).
const WALK_MARKER: &[u8] = b"\0skillbox-walk:";
/// The largest walk frame: a bigger walk is made by its own helper run.
const MAX_WALK_FRAME: usize = 16 * 1024 * 1024;
/// After the status line of a sandbox's last exec, how long its output may take to
/// end before what holds it open is killed (no reset is paid when it ends in time).
const LAST_GRACE: std::time::Duration = std::time::Duration::from_millis(100);

/// skillbox's seccomp filter as the wrapper takes it (hex), made once per process.
pub(crate) fn filter_hex() -> &'static str {
    static FILTER: OnceLock<String> = OnceLock::new();
    FILTER.get_or_init(|| hex(&skillbox_seccomp::filter_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One output stream, cut at the cap (the rest is drained and dropped).
struct Capped {
    cap: u64,
    kept: u64,
    truncated: bool,
    stderr: bool,
}

impl Capped {
    fn new(cap: u64, stderr: bool) -> Capped {
        Capped {
            cap,
            kept: 0,
            truncated: false,
            stderr,
        }
    }

    async fn feed(&mut self, data: &[u8], tx: &mpsc::Sender<EnvResult<ExecEvent>>) {
        if data.is_empty() {
            return;
        }
        let room = self.cap.saturating_sub(self.kept);
        let take = (data.len() as u64).min(room) as usize;
        if take < data.len() {
            self.truncated = true;
        }
        if take == 0 {
            return;
        }
        self.kept += take as u64;
        let chunk = Bytes::copy_from_slice(&data[..take]);
        let event = if self.stderr {
            ExecEvent::Stderr(chunk)
        } else {
            ExecEvent::Stdout(chunk)
        };
        // A dropped stream does not stop the exec; the output is drained regardless.
        let _ = tx.send(Ok(event)).await;
    }
}

/// What skillbox is doing about an exec while its output is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The command runs.
    Running,
    /// Its status line is in: what it left behind (holding the output open, say) is
    /// being killed so the output can end.
    Settling,
    /// skillbox is killing it.
    Killing(Kill),
}

impl Phase {
    fn kill(self) -> Option<Kill> {
        match self {
            Phase::Killing(kill) => Some(kill),
            Phase::Running | Phase::Settling => None,
        }
    }
}

/// A reset of the container (a kill, or killing what an exec left) that runs alongside
/// the reading: output left unread could stall the container's next exec.
type Reset = Pin<Box<dyn Future<Output = EnvResult<()>> + Send>>;

fn start_reset(container: &Arc<Container>, kill: bool) -> Reset {
    let container = container.clone();
    Box::pin(async move {
        if kill {
            kill_all(&container).await
        } else {
            settle(&container).await
        }
    })
}

/// The wrapper's command line: the filter, the working directory, the caller's
/// variables (which reach only the command, never the wrapper), the command. Never the
/// status key: whatever the command starts can read every command line in the
/// container.
fn wrapper_argv(
    container: &Container,
    cwd: &str,
    inputs: usize,
    walk: Vec<String>,
    env: &std::collections::BTreeMap<String, String>,
    command: Vec<String>,
) -> Vec<String> {
    let mut argv = vec![
        container.runtime.perl().to_string(),
        "-e".into(),
        EXEC_PL.into(),
        NR_PRCTL.to_string(),
        NR_SECCOMP.to_string(),
        NR_EXIT_GROUP.to_string(),
        filter_hex().to_string(),
        cwd.to_string(),
        // See helpers/exec.pl.
        inputs.to_string(),
        walk.len().to_string(),
    ];
    argv.extend(walk);
    argv.push(env.len().to_string());
    argv.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
    argv.extend(command);
    argv
}

type Output = crate::daemon::ExecOutput;

/// The input files as the wrapper reads them after its key: a header line
/// `<length> <path>`, then the bytes, for each (see helpers/exec.pl).
fn encode_inputs(inputs: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(inputs.iter().map(|(p, d)| p.len() + d.len() + 24).sum());
    for (path, data) in inputs {
        out.extend_from_slice(format!("{} {path}\n", data.len()).as_bytes());
        out.extend_from_slice(data);
    }
    out
}

/// Creates and starts the exec, attached; feeds it the status `key` (the first line of
/// its stdin, which the wrapper takes), the input files (`inputs`, encoded) and then the
/// command's `stdin`, in a task of its own.
async fn start(
    container: &Container,
    argv: Vec<String>,
    key: &StatusKey,
    inputs: Vec<u8>,
    stdin: Option<Vec<u8>>,
) -> EnvResult<(Output, tokio::task::JoinHandle<()>)> {
    let attach = Attach {
        argv,
        stdin: true,
        user: None,
        output_capacity: Some(64 * 1024),
    };
    let Attached {
        output, mut input, ..
    } = start_attached(
        &container.docker,
        &container.id,
        container.runtime.backend(),
        "exec",
        attach,
    )
    .await?;
    let key = key.line();
    let writer = tokio::spawn(async move {
        if input.write_all(key.as_bytes()).await.is_ok()
            && input.write_all(&inputs).await.is_ok()
            && let Some(data) = stdin
        {
            let _ = input.write_all(&data).await;
        }
        let _ = input.shutdown().await;
    });
    Ok((output, writer))
}

/// One exec while its output is read, and after.
struct Reading {
    container: Arc<Container>,
    tx: mpsc::Sender<EnvResult<ExecEvent>>,
    stdout: Capped,
    stderr: Capped,
    /// The end of stderr, held back: the wrapper's status line is its last line.
    tail: Vec<u8>,
    key: StatusKey,
    /// Feeds the key and the command's stdin.
    writer: Option<tokio::task::JoinHandle<()>>,
    /// The sandbox's last exec ([`ExecRequest::last`]): what the command leaves in the
    /// background is left to cleanup, unless it holds the output open.
    last: bool,
    /// The wrapper makes a walk after the command: stderr from a walk marker on is held
    /// back while it can still be the frame (at most the length its header gives, and
    /// the status line), until the end tells whether it is.
    walk: bool,
    /// The walk's output, from its frame.
    walked: Option<Vec<u8>>,
}

/// Where stderr's held-back part starts in `tail`: the first walk marker that can still
/// start the frame, if one is expected (`walk`); else the last [`HOLD_BACK`] bytes. A
/// look-alike the command wrote is let go as soon as what follows it cannot be a frame.
fn hold_from(tail: &[u8], walk: bool) -> usize {
    let limit = tail.len().saturating_sub(HOLD_BACK);
    if !walk {
        return limit;
    }
    let mut from = 0;
    while let Some(rel) = find(&tail[from..], WALK_MARKER) {
        let at = from + rel;
        if may_be_frame(&tail[at + WALK_MARKER.len()..]) {
            return at.min(limit);
        }
        from = at + 1;
    }
    limit
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A frame's header, after its marker: the length of its output in decimal digits, LF
/// within the first 12 bytes; `Some((header length with the LF, output length))`.
fn frame_header(rest: &[u8]) -> Option<(usize, usize)> {
    let nl = rest.iter().take(12).position(|&b| b == b'\n')?;
    let digits = &rest[..nl];
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let len = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some((nl + 1, len))
}

/// Whether `rest`, what follows a walk marker up to the end of stderr so far, can still
/// be a frame with at most the status line after it: a header not all in yet, or one
/// of at most [`MAX_WALK_FRAME`] bytes that `rest` does not outrun.
fn may_be_frame(rest: &[u8]) -> bool {
    match frame_header(rest) {
        Some((header, len)) => len <= MAX_WALK_FRAME && rest.len() - header <= len + HOLD_BACK,
        None => rest.len() < 12 && rest.iter().all(u8::is_ascii_digit),
    }
}

/// Splits the walk frame off the end of stderr (`tail`, the status line already off):
/// where the command's own stderr ends, and the walk's output if a whole frame ends
/// exactly there.
fn split_walk(tail: &[u8]) -> (usize, Option<Vec<u8>>) {
    let mut from = 0;
    while let Some(rel) = find(&tail[from..], WALK_MARKER) {
        let at = from + rel;
        let rest = &tail[at + WALK_MARKER.len()..];
        if let Some((header, len)) = frame_header(rest)
            && rest.len() == header + len
        {
            return (at, Some(rest[header..].to_vec()));
        }
        from = at + 1;
    }
    (tail.len(), None)
}

impl Reading {
    /// Reads the output to its end (or the container's death), killing the command
    /// at the deadline or on cancel, and says what it saw.
    async fn read(
        &mut self,
        mut output: Output,
        deadline: tokio::time::Instant,
        cancel: &CancellationToken,
    ) -> Seen {
        let container = self.container.clone();
        let backend = container.runtime.backend();
        let mut phase = Phase::Running;
        let mut reset: Option<Reset> = None;
        // A last exec's status is in: when its output must have ended by.
        let mut grace: Option<tokio::time::Instant> = None;
        let mut failure: Option<EnvError> = None;
        let mut died = false;
        loop {
            tokio::select! {
                frame = output.next() => match frame {
                    Some(Ok(LogOutput::StdOut { message })) => self.stdout.feed(&message, &self.tx).await,
                    Some(Ok(LogOutput::StdErr { message })) => {
                        self.tail.extend_from_slice(&message);
                        // The status line is the last: it is within the new bytes and
                        // what was held back before them.
                        let recent = self.tail.len().saturating_sub(message.len() + HOLD_BACK);
                        if phase == Phase::Running && split_status(&self.tail[recent..], &self.key).1.is_some() {
                            phase = Phase::Settling;
                            if self.last {
                                grace = Some(tokio::time::Instant::now() + LAST_GRACE);
                            } else {
                                reset = Some(start_reset(&container, false));
                            }
                        }
                        let from = hold_from(&self.tail, self.walk);
                        if from > 0 {
                            let emit: Vec<u8> = self.tail.drain(..from).collect();
                            self.stderr.feed(&emit, &self.tx).await;
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        failure = Some(op_error(backend, "exec output", &e));
                        break;
                    }
                    None => break,
                },
                done = async {
                    match reset.as_mut() {
                        Some(pending) => pending.await,
                        None => std::future::pending().await,
                    }
                }, if reset.is_some() => {
                    reset = None;
                    if let Err(e) = done { failure = Some(e); break; }
                }
                // A last exec's output did not end in time: something it left holds it.
                () = async {
                    match grace {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                }, if grace.is_some() && reset.is_none() && phase == Phase::Settling => {
                    grace = None;
                    tracing::debug!(container = %container.id, "docker: a last exec's output is still open {LAST_GRACE:?} after its status: resetting");
                    reset = Some(start_reset(&container, false));
                }
                // Not once the status is in: the command has ended, and its status is
                // the outcome however long settling what it left takes (the settle is
                // bounded, and kills all it finds).
                () = tokio::time::sleep_until(deadline), if phase == Phase::Running => {
                    phase = Phase::Killing(Kill::Deadline);
                    reset = Some(start_reset(&container, true));
                }
                () = cancel.cancelled(), if phase.kill().is_none() => {
                    phase = Phase::Killing(Kill::Abort);
                    reset = Some(start_reset(&container, true));
                }
                // The container is being removed: nothing left to kill.
                () = container.shutdown.cancelled(), if phase.kill().is_none() => {
                    phase = Phase::Killing(Kill::Abort);
                }
                () = container.died.cancelled() => {
                    died = true;
                    break;
                }
            }
        }
        // The stream ended while a reset was still under way: let it finish.
        if let Some(pending) = reset.take()
            && let Err(e) = pending.await
        {
            failure.get_or_insert(e);
        }
        if let Some(writer) = self.writer.take() {
            writer.abort();
        }
        let (end, status) = split_status(&self.tail, &self.key);
        let tail = std::mem::take(&mut self.tail);
        let (end, walked) = match (self.walk, status) {
            (true, Some(_)) => split_walk(&tail[..end]),
            _ => (end, None),
        };
        self.walked = walked;
        self.stderr.feed(&tail[..end], &self.tx).await;
        // The output ended without the status line starting a reset (the command and
        // everything it started closed it): check that nothing is left.
        if !died
            && phase == Phase::Running
            && !container.died.is_cancelled()
            && let Err(e) = settle(&container).await
        {
            failure.get_or_insert(e);
        }
        // The output also ends when the whole container dies (under gVisor, the memory
        // limit takes the sandbox's kernel with the code that hit it); a reset that
        // failed may be the first sign of it.
        let died = died
            || container.died.is_cancelled()
            || (status.is_none() && phase.kill().is_none() && container.stopped().await);
        Seen {
            kill: phase.kill(),
            status,
            failure,
            died,
            removed: container.is_removed(),
        }
    }

    /// Whether the container's memory limit ended the exec, by the daemon's record.
    async fn out_of_memory(&self, end: &ExecEnd, ooms_before: u64) -> bool {
        let container = &self.container;
        match end {
            ExecEnd::ContainerDied => container.died_of_memory(ooms_before).await,
            // A SIGKILL that was not ours may be the memory cgroup's.
            end if end.may_be_memory() => container.oom_after(ooms_before).await,
            _ => false,
        }
    }

    fn truncated(&self) -> Truncated {
        Truncated {
            stdout: self.stdout.truncated,
            stderr: self.stderr.truncated,
        }
    }
}

#[async_trait]
impl Shell for DockerSandbox {
    async fn exec_stream(
        &self,
        request: ExecRequest,
        cancel: &CancellationToken,
    ) -> EnvResult<ExecStream> {
        self.exec_with_inputs(Vec::new(), request, cancel).await
    }
}

impl DockerSandbox {
    /// Runs `request` under the exec wrapper, which first writes `inputs` (absolute
    /// paths in the container, with their bytes): one exec for both.
    pub(crate) async fn exec_with_inputs(
        &self,
        inputs: Vec<(String, Vec<u8>)>,
        request: ExecRequest,
        cancel: &CancellationToken,
    ) -> EnvResult<ExecStream> {
        request.validate()?;
        if inputs.len() > MAX_INPUTS {
            return Err(EnvError::invalid(format!(
                "exec: at most {MAX_INPUTS} input files in one exec"
            )));
        }
        if let Some((bad, _)) = inputs
            .iter()
            .find(|(p, _)| !p.starts_with('/') || p.ends_with('/') || p.contains(['\0', '\n']))
        {
            return Err(EnvError::invalid(format!(
                "exec: input path {bad:?}: an absolute file path without NUL or newline"
            )));
        }
        let turn = self.take_turn(cancel).await?;
        let container = self.container().clone();
        // Cleared only once what the last exec left is dead (a caller that gives up
        // meanwhile leaves it set).
        if self.unsettled.load(Ordering::SeqCst) {
            settle(&container).await?;
        }
        self.unsettled.store(request.last, Ordering::SeqCst);
        let backend = self.backend_name();
        let timeout = request
            .timeout
            .unwrap_or_else(|| container.limits.timeout());
        let deadline = tokio::time::Instant::now() + timeout;
        let key = StatusKey::random().map_err(|e| {
            EnvError::new(
                ErrorCode::Unavailable,
                format!("{backend}: no key for the exec's status: {e}"),
            )
        })?;
        let cwd = self.arg(request.cwd.as_deref().unwrap_or(self.default_cwd()));
        let command = request.command.to_argv();
        let program = command.first().cloned().unwrap_or_default();
        let env = self.exec_env(&request.env);
        // The walk announced, made by the wrapper after the command, in this exec.
        let walk_after = request.walk_after.filter(|w| w.root.is_absolute());
        let walk_argv = walk_after.as_ref().map(|w| {
            let prune: Vec<&str> = w.prune.iter().map(String::as_str).collect();
            // The wrapper's budget first, then the file helper's walkread arguments.
            let mut argv = vec![timeout.as_secs().to_string()];
            argv.extend(walkread_args(
                &w.root.display().to_string(),
                w.max_entries,
                &prune,
            ));
            argv
        });
        let argv = wrapper_argv(
            &container,
            &cwd,
            inputs.len(),
            walk_argv.unwrap_or_default(),
            &env,
            command,
        );
        let generation = self.generation();
        let walk_slot = self.walk_ahead.clone();
        // What a last exec leaves in the background runs until the container goes, but
        // its network ends with the exec: the proxy stops (its record complete) before
        // the exec answers.
        let egress = request
            .last
            .then(|| self.egress.as_ref().map(|e| e.proxy.clone()))
            .flatten();
        let input_paths: Vec<String> = inputs.iter().map(|(p, _)| p.clone()).collect();
        let (output, writer) = start(
            &container,
            argv,
            &key,
            encode_inputs(&inputs),
            request.stdin,
        )
        .await?;
        drop(inputs);
        let last = request.last;
        let started_at = Instant::now();
        let ooms_before = container.ooms.load(Ordering::SeqCst);
        let (tx, stream) = ExecStream::channel();
        let cancel = cancel.clone();
        let cap = container.limits.output_bytes;
        let ended = CancellationToken::new();
        let stream =
            stream.with_connector(Arc::new(DockerConnector::new(&container, ended.clone())));
        tokio::spawn(async move {
            let _turn = turn;
            let _ended = ended.clone().drop_guard();
            let mut reading = Reading {
                container: container.clone(),
                tx: tx.clone(),
                stdout: Capped::new(cap, false),
                stderr: Capped::new(cap, true),
                tail: Vec::new(),
                key,
                writer: Some(writer),
                last,
                walk: walk_after.is_some(),
                walked: None,
            };
            let seen = reading.read(output, deadline, &cancel).await;
            if let Some(proxy) = egress {
                proxy.stop().await;
            }
            // Kept before the exec answers: the walk that follows finds it.
            if let (Some(walk), Some(out)) = (walk_after, reading.walked.take())
                && let Ok(mut slot) = walk_slot.lock()
            {
                *slot = Some(WalkAhead {
                    generation,
                    walk,
                    out,
                });
            }
            let oom_inside = seen.status.is_some_and(|s| s.split_oom().1);
            let end = ExecEnd::from(seen);
            let died = matches!(end, ExecEnd::ContainerDied);
            if died {
                container.died.cancel();
            }
            // The wrapper's count is the answer when it has one: no wait for an event.
            let oom = !oom_inside && reading.out_of_memory(&end, ooms_before).await;
            if died {
                container.remove().await;
            }
            // A command that failed with its disk full ran out of disk.
            let memory = oom_inside || (oom && end.may_be_memory());
            let disk_full = !memory && end.may_be_disk() && container.disk_full().await;
            if let Some(note) = end.note(&program) {
                reading.stderr.feed(note.as_bytes(), &tx).await;
            }
            let measured = Measured {
                truncated: reading.truncated(),
                oom,
                oom_inside,
                disk_full,
                duration: started_at.elapsed(),
            };
            let result = match end {
                ExecEnd::Finished {
                    status: Some(Status::InputFailed(n)),
                    ..
                } => Err(Status::input_error(n, &input_paths)),
                end => outcome(end, measured, &cwd, backend),
            };
            // Nothing it served is reached once its end is told.
            ended.cancel();
            let _ = tx.send(result.map(ExecEvent::Exit)).await;
        });
        Ok(stream)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Runs the exec wrapper here, on the host (under its own seccomp filter), with
    /// `key` on stdin, and splits its status off stderr.
    fn wrapper(
        key: &str,
        command: &[&str],
        stdin: &[u8],
        status_key: &StatusKey,
    ) -> (Vec<u8>, Vec<u8>, Option<Status>) {
        use std::io::Write as _;
        let mut child = std::process::Command::new("perl")
            .args(["-e", EXEC_PL])
            .args([NR_PRCTL, NR_SECCOMP, NR_EXIT_GROUP].map(|n| n.to_string()))
            .args([filter_hex(), "/", "0", "0", "0"])
            .args(command)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        input.write_all(key.as_bytes()).unwrap();
        input.write_all(stdin).unwrap();
        drop(input);
        let out = child.wait_with_output().unwrap();
        let (end, status) = split_status(&out.stderr, status_key);
        (out.stdout, out.stderr[..end].to_vec(), status)
    }

    /// The wrapper's tags are the ones skillbox checks, for every kind of ending, and
    /// the command gets its stdin without the key line.
    #[test]
    fn the_wrapper_tags_its_status_under_the_key_it_was_given() {
        let key = StatusKey::random().unwrap();
        let line = key.line();
        let (stdout, stderr, status) = wrapper(
            &line,
            &["sh", "-c", "cat; echo oops >&2; exit 3"],
            b"input",
            &key,
        );
        assert_eq!(
            (stdout.as_slice(), stderr.as_slice()),
            (&b"input"[..], &b"oops\n"[..])
        );
        assert_eq!(status, Some(Status::Exit(3)));
        let (_, _, status) = wrapper(&line, &["sh", "-c", "kill -TERM $$"], b"", &key);
        assert_eq!(status, Some(Status::Signal(libc::SIGTERM)));
        let (_, _, status) = wrapper(&line, &["/no/such/program"], b"", &key);
        assert_eq!(status, Some(Status::ExecFailed(libc::ENOENT)));
        // Under another key the same line is not believed.
        let (_, stderr, status) = wrapper(&line, &["true"], b"", &StatusKey::random().unwrap());
        assert_eq!(status, None);
        assert!(stderr.starts_with(b"\0skillbox-status:"), "{stderr:?}");
        // Without a key the wrapper runs nothing and says nothing.
        let (stdout, stderr, status) = wrapper("\n", &["echo", "ran"], b"", &key);
        assert_eq!((stdout.len(), stderr.len(), status), (0, 0, None));
    }

    /// A reading of a container no daemon answers for: nothing the test drives may
    /// reach one (a reset would fail, and show).
    fn reading(key: StatusKey, last: bool, walk: bool) -> (Reading, ExecStream) {
        let docker = bollard::Docker::connect_with_http(
            "http://127.0.0.1:1",
            5,
            bollard::API_DEFAULT_VERSION,
        )
        .unwrap();
        let container = Container::started(
            docker,
            "no-such-container".into(),
            crate::runtime::Runtime::Runc,
            skillbox_env::Limits::default(),
            "1".into(),
            crate::daemon::Live::default(),
            0,
        );
        let (tx, stream) = ExecStream::channel();
        let reading = Reading {
            container,
            tx,
            stdout: Capped::new(1 << 20, false),
            stderr: Capped::new(1 << 20, true),
            tail: Vec::new(),
            key,
            writer: None,
            last,
            walk,
            walked: None,
        };
        (reading, stream)
    }

    /// Stderr `frames` (each after the pause before it), then the output's end after
    /// `end`.
    fn output(frames: Vec<(Duration, Vec<u8>)>, end: Duration) -> Output {
        let frames = futures_util::stream::iter(frames).then(|(pause, message)| async move {
            tokio::time::sleep(pause).await;
            Ok(LogOutput::StdErr {
                message: Bytes::from(message),
            })
        });
        let end = futures_util::stream::once(tokio::time::sleep(end))
            .filter_map(|()| async { None::<Result<LogOutput, bollard::errors::Error>> });
        Box::pin(frames.chain(end))
    }

    fn status_line(key: &StatusKey, status: Status, text: &str) -> Vec<u8> {
        format!("\0skillbox-status:{}:{text}\n", key.tag(status).unwrap()).into_bytes()
    }

    /// The marker and what follows it, for a failed assertion.
    fn shown(tail: &[u8]) -> String {
        let at = tail.iter().position(|&b| b == 0).unwrap_or(0);
        String::from_utf8_lossy(&tail[at..tail.len().min(at + 32)]).into_owned()
    }

    /// Stderr held back by [`hold_from`], for `tail`, with a walk expected.
    fn held(tail: &[u8]) -> usize {
        tail.len() - hold_from(tail, true)
    }

    /// A walk marker holds stderr back only while what follows it can still be the
    /// frame: a look-alike is let go as soon as it cannot be (a header that is not a
    /// length, a length over the largest frame, more bytes than its length), and a
    /// marker after it can still be the frame.
    #[test]
    fn only_what_can_still_be_the_walk_frame_is_held_back() {
        let bulk = vec![b'x'; 10_000];
        // The command's stderr before the marker (longer than what is always held).
        let before = vec![b'e'; 1000];
        let marked =
            |header: &[u8], rest: &[u8]| [&before[..], b"\0skillbox-walk:", header, rest].concat();
        // No marker: the last bytes, where the status line will be.
        assert_eq!(held(&bulk), HOLD_BACK);
        // A frame on its way, or a header not all in yet: held from its marker.
        for tail in [
            marked(b"", b""),
            marked(b"10", b""),
            marked(b"12000\n", &bulk),
            marked(b"10000\n", &bulk),
            // A whole frame and a status line after it.
            marked(b"9872\n", &bulk),
        ] {
            let from_marker = tail.len() - before.len();
            assert_eq!(held(&tail), from_marker.max(HOLD_BACK), "{}", shown(&tail));
        }
        // Look-alikes: what the command wrote is let go but the last bytes.
        for tail in [
            marked(b"oops\n", &bulk),
            marked(b"", &bulk),
            marked(b"+5\n", &bulk),
            marked(b"\n", &bulk),
            marked(b"111111111111\n", &bulk),
            // Longer than the largest frame.
            marked(b"16777217\n", &bulk),
            // More bytes than a frame of its length and a status line.
            marked(b"9871\n", &bulk),
            marked(b"10\n", &bulk),
        ] {
            assert_eq!(held(&tail), HOLD_BACK, "{}", shown(&tail));
        }
        // A look-alike, then a marker that can still be the frame: held from the
        // second.
        let frame = [&b"\0skillbox-walk:500\n"[..], &[b'y'; 300]].concat();
        let second = [marked(b"x", &bulk), frame.clone()].concat();
        assert_eq!(held(&second), frame.len());
        // No walk asked for: no marker is anything.
        let tail = marked(b"10000\n", &bulk);
        assert_eq!(tail.len() - hold_from(&tail, false), HOLD_BACK);
    }

    /// A look-alike of the walk marker early in stderr does not hold the command's
    /// stderr back while it runs; the real frame at the end is still taken.
    #[tokio::test(start_paused = true)]
    async fn stderr_after_a_walk_marker_look_alike_streams() {
        let key = StatusKey::random().unwrap();
        let (mut reading, mut events) = reading(key, true, true);
        let mut early = b"\0skillbox-walk:not a frame\n".to_vec();
        early.extend(vec![b'x'; 64 * 1024]);
        let mut end = b"\0skillbox-walk:7\nlisting".to_vec();
        end.extend(status_line(&key, Status::Exit(0), "exit 0"));
        let running = Duration::from_secs(60);
        let output = output(
            vec![(Duration::ZERO, early.clone()), (running, end)],
            Duration::ZERO,
        );
        let start = tokio::time::Instant::now();
        let read = tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + 2 * running;
            let seen = reading
                .read(output, deadline, &CancellationToken::new())
                .await;
            (reading, seen)
        });
        // All but the last bytes arrive while the command still runs.
        let mut got = Vec::new();
        while got.len() < early.len() - HOLD_BACK {
            match tokio::time::timeout(running / 2, events.next()).await {
                Ok(Some(Ok(ExecEvent::Stderr(chunk)))) => got.extend_from_slice(&chunk),
                other => panic!("{other:?} with {} bytes of stderr in", got.len()),
            }
        }
        assert!(start.elapsed() < running);
        let (reading, seen) = read.await.unwrap();
        assert_eq!(seen.status, Some(Status::Exit(0)), "{seen:?}");
        assert_eq!(reading.walked.as_deref(), Some(&b"listing"[..]));
        while let Ok(Some(Ok(ExecEvent::Stderr(chunk)))) =
            tokio::time::timeout(Duration::ZERO, events.next()).await
        {
            got.extend_from_slice(&chunk);
        }
        assert_eq!(got, early);
    }

    /// A last exec's status is in; its output stays open a while (what it left holds
    /// it), and the deadline passes meanwhile: the command had ended, so the exec ends
    /// with its status, not as timed out, and nothing is killed.
    #[tokio::test(start_paused = true)]
    async fn a_deadline_after_the_status_line_is_not_a_timeout() {
        let key = StatusKey::random().unwrap();
        let (mut reading, _events) = reading(key, true, false);
        let status = status_line(&key, Status::Exit(0), "exit 0");
        let start = tokio::time::Instant::now();
        // The deadline falls within the last exec's grace, before its output ends.
        let deadline = start + Duration::from_millis(50);
        assert!(Duration::from_millis(80) < LAST_GRACE);
        let output = output(vec![(Duration::ZERO, status)], Duration::from_millis(80));
        let seen = reading
            .read(output, deadline, &CancellationToken::new())
            .await;
        assert!(tokio::time::Instant::now() >= deadline);
        assert_eq!(seen.kill, None, "{seen:?}");
        assert_eq!(seen.status, Some(Status::Exit(0)), "{seen:?}");
        assert!(seen.failure.is_none() && !seen.died, "{seen:?}");
        assert_eq!(
            ExecEnd::from(seen),
            ExecEnd::Finished {
                status: Some(Status::Exit(0)),
                timed_out: false
            }
        );
    }
}
