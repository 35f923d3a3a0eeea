//! Reaching what a running exec serves, from the host side (DESIGN.md §3.3), without
//! giving the container a network. Each connection is a relay ([`helpers/relay.pl`])
//! started in the container as the sandbox's own user: it connects there, to
//! `127.0.0.1:PORT` on the container's loopback (gVisor's own network stack under
//! runsc) or to a unix socket under `/workspace`, says in one line whether that
//! worked, and then carries the bytes over its attached stdin and stdout. The relay can
//! do nothing the sandbox's code could not: it is that user, inside that container.
//!
//! What comes back over the relay's stdout is the sandbox's, read as untrusted bytes
//! like any exec output; its stderr is dropped (the relay's own complaints).

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use bollard::container::LogOutput;
use bytes::{Buf, Bytes};
use futures_util::{Stream, StreamExt};
use skillbox_env::{
    CancellationToken, Duplex, Endpoint, EnvError, EnvResult, ErrorCode, ExecConnector,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::container::Container;
use crate::daemon::{
    Attach, Attached, ExecInput, ExecOutput, LINE_BYTES, collect_exec, start_attached, unavailable,
};
use crate::exec::filter_hex;
use crate::runtime::{NR_PRCTL, NR_SECCOMP};

const RELAY_PL: &str = include_str!("helpers/relay.pl");

/// The longest a connect may take: the relay's start (tens of milliseconds under runc,
/// more under gVisor and load) and its connect on the container's loopback.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Relays being started at once, in this process (each is an exec the daemon makes).
const CONCURRENT_CONNECTS: usize = 32;
/// Of those, for one exec: a service that never answers holds at most these.
const CONCURRENT_CONNECTS_PER_EXEC: usize = 4;
/// The longest socket path a `sockaddr_un` holds (108 bytes with its NUL).
const MAX_SOCKET_PATH: usize = 107;
/// The relay's answer is one short line.
const ANSWER_BYTES: usize = 4096;

fn connects() -> &'static tokio::sync::Semaphore {
    static PLACES: std::sync::OnceLock<tokio::sync::Semaphore> = std::sync::OnceLock::new();
    PLACES.get_or_init(|| tokio::sync::Semaphore::new(CONCURRENT_CONNECTS))
}

/// Connects into one exec of a container sandbox.
#[derive(Debug)]
pub(crate) struct DockerConnector {
    container: Weak<Container>,
    /// The container's id, for [`ExecConnector::process`].
    id: String,
    /// Fired once the exec has ended: nothing it served is there any more.
    ended: CancellationToken,
    /// This exec's share of the connect places.
    places: Arc<tokio::sync::Semaphore>,
    /// Kills of relays whose connection was dropped, at once for this exec.
    kills: Arc<tokio::sync::Semaphore>,
}

impl DockerConnector {
    pub(crate) fn new(container: &Arc<Container>, ended: CancellationToken) -> Self {
        DockerConnector {
            container: Arc::downgrade(container),
            id: container.id.clone(),
            ended,
            places: Arc::new(tokio::sync::Semaphore::new(CONCURRENT_CONNECTS_PER_EXEC)),
            kills: Arc::new(tokio::sync::Semaphore::new(CONCURRENT_CONNECTS_PER_EXEC)),
        }
    }

    /// The container while the exec runs in it.
    fn running(&self, endpoint: &Endpoint) -> EnvResult<Arc<Container>> {
        let gone = || unavailable(format!("connect to {endpoint}: the exec has ended"));
        let container = self.container.upgrade().ok_or_else(gone)?;
        if self.ended.is_cancelled() || container.is_removed() || container.died.is_cancelled() {
            return Err(gone());
        }
        Ok(container)
    }
}

/// The relay's command line for `endpoint`.
fn relay_argv(container: &Container, endpoint: &Endpoint) -> EnvResult<Vec<String>> {
    let (kind, whereto) = match endpoint {
        Endpoint::Port(port) => ("port", port.to_string()),
        Endpoint::Socket(path) => {
            let relative = Endpoint::socket_in_workspace(path)?;
            // A service's socket is in a capability's workspace, always at the default root.
            let whereto = format!(
                "{}/{}",
                skillbox_env::DEFAULT_WORKSPACE_ROOT,
                relative.display()
            );
            if whereto.len() > MAX_SOCKET_PATH {
                return Err(EnvError::invalid(format!(
                    "socket {}: longer than a unix socket address holds ({MAX_SOCKET_PATH} bytes)",
                    path.display()
                )));
            }
            ("socket", whereto)
        }
    };
    Ok(vec![
        container.runtime.perl().to_string(),
        "-e".into(),
        RELAY_PL.into(),
        NR_PRCTL.to_string(),
        NR_SECCOMP.to_string(),
        filter_hex().to_string(),
        kind.into(),
        whereto,
    ])
}

/// A relay as the container's kernel names it: its pid and its start time (so a pid
/// taken again by another process is not mistaken for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RelayId {
    pid: u32,
    start: u64,
}

/// The highest pid Linux gives (`PID_MAX_LIMIT`).
const PID_MAX: u32 = 4 << 20;

/// What the relay's first line says: connected (and who it is in the container), or
/// the errno and text of why not.
fn answer(endpoint: &Endpoint, line: &[u8]) -> EnvResult<RelayId> {
    let text = String::from_utf8_lossy(line);
    let text = text.trim_end();
    let connected = text.strip_prefix("+ ").and_then(|rest| {
        let (pid, start) = rest.split_once(' ')?;
        let pid: u32 = pid.parse().ok().filter(|p| (2..=PID_MAX).contains(p))?;
        Some(RelayId {
            pid,
            start: start.parse().ok()?,
        })
    });
    if let Some(id) = connected {
        return Ok(id);
    }
    let failure = text.strip_prefix("- ").and_then(|rest| {
        let (errno, why) = rest.split_once(' ')?;
        Some((errno.parse::<i32>().ok()?, why))
    });
    Err(match failure {
        Some((errno, why)) => {
            let code = match skillbox_env::errno_code(errno) {
                // A full queue of connections: it does not accept (yet), as refused.
                _ if errno == libc::EAGAIN => ErrorCode::Unavailable,
                ErrorCode::Unknown => ErrorCode::Unavailable,
                code => code,
            };
            EnvError::new(code, format!("connect to {endpoint}: {why}"))
        }
        None => unavailable(format!(
            "connect to {endpoint}: the relay in the container answered {:?}",
            text.chars().take(200).collect::<String>()
        )),
    })
}

#[async_trait]
impl ExecConnector for DockerConnector {
    fn process(&self) -> String {
        format!("container {}", &self.id[..self.id.len().min(12)])
    }

    async fn connect(
        &self,
        endpoint: &Endpoint,
        cancel: &CancellationToken,
    ) -> EnvResult<Box<dyn Duplex>> {
        let argv = {
            let container = self.running(endpoint)?;
            relay_argv(&container, endpoint)?
        };
        let gone = || EnvError::new(ErrorCode::Unknown, "connect: the connect places are gone");
        let _own = tokio::select! {
            place = self.places.acquire() => place.map_err(|_| gone())?,
            () = cancel.cancelled() => return Err(EnvError::aborted("connect")),
        };
        let _place = tokio::select! {
            place = connects().acquire() => place.map_err(|_| gone())?,
            () = cancel.cancelled() => return Err(EnvError::aborted("connect")),
        };
        let container = self.running(endpoint)?;
        let opened = async {
            let attach = Attach {
                argv,
                stdin: true,
                user: None,
                output_capacity: Some(64 * 1024),
            };
            let Attached { output, input, .. } = start_attached(
                &container.docker,
                &container.id,
                container.runtime.backend(),
                "connect",
                attach,
            )
            .await?;
            let mut relayed = Relayed {
                output,
                input,
                pending: Bytes::new(),
                container: Arc::downgrade(&container),
                endpoint: endpoint.clone(),
                relay: None,
                ended: false,
                kills: self.kills.clone(),
                exec_ended: self.ended.clone(),
            };
            let line = relayed.first_line().await?;
            relayed.relay = Some(answer(endpoint, &line)?);
            Ok::<_, EnvError>(relayed)
        };
        let relayed = tokio::select! {
            opened = tokio::time::timeout(CONNECT_TIMEOUT, opened) => opened.map_err(|_| {
                EnvError::new(
                    ErrorCode::Timeout,
                    format!(
                        "connect to {endpoint}: no answer within {} s (it does not accept)",
                        CONNECT_TIMEOUT.as_secs()
                    ),
                )
            })??,
            () = cancel.cancelled() => return Err(EnvError::aborted("connect")),
            () = self.ended.cancelled() => {
                return Err(unavailable(format!("connect to {endpoint}: the exec has ended")));
            }
        };
        Ok(Box::new(relayed))
    }
}

/// One connection through a relay: reads are the relay's stdout, writes its stdin,
/// and a shutdown closes its stdin (which it passes on as a half close). Dropped before
/// the relay ended, it kills the relay, as closing a socket would end the connection.
struct Relayed {
    output: ExecOutput,
    input: ExecInput,
    /// Read from the relay and not yet given out.
    pending: Bytes,
    container: Weak<Container>,
    /// What it connects to.
    endpoint: Endpoint,
    /// Who the relay is, once it answered.
    relay: Option<RelayId>,
    /// Its output ended: the relay is gone.
    ended: bool,
    /// The exec's places for kills, and its end (after which its reset kills them all).
    kills: Arc<tokio::sync::Semaphore>,
    exec_ended: CancellationToken,
}

impl Drop for Relayed {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let Some(container) = self.container.upgrade() else {
            return;
        };
        if container.is_removed() || self.exec_ended.is_cancelled() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let known = self.relay;
        let mut output: ExecOutput = Box::pin(futures_util::stream::empty());
        std::mem::swap(&mut output, &mut self.output);
        let (kills, exec_ended) = (self.kills.clone(), self.exec_ended.clone());
        let endpoint = self.endpoint.clone();
        runtime.spawn(async move {
            // Dropped before its answer: the answer (if it connects) says whom to kill.
            let relay = match known {
                Some(relay) => relay,
                None => {
                    let line = tokio::time::timeout(CONNECT_TIMEOUT, first_line(&mut output));
                    match line.await {
                        Ok(Ok((line, _))) => match answer(&endpoint, &line) {
                            Ok(relay) => relay,
                            Err(_) => return,
                        },
                        _ => return,
                    }
                }
            };
            drop(output);
            let Ok(_place) = kills.acquire().await else {
                return;
            };
            if container.is_removed() || exec_ended.is_cancelled() {
                return;
            }
            kill(&container, relay).await;
        });
    }
}

/// Kills `relay` as the sandbox's user (its own user may signal it: the relay is the
/// sandbox's user's, like the code), if its pid still has its start time.
async fn kill(container: &Container, relay: RelayId) {
    let argv = vec![
        container.runtime.perl().to_string(),
        "-e".into(),
        KILL_PL.into(),
        relay.pid.to_string(),
        relay.start.to_string(),
    ];
    let killed = collect_exec(
        &container.docker,
        &container.id,
        container.runtime.backend(),
        "kill a relay",
        argv,
        None,
        LINE_BYTES,
    )
    .await;
    if let Err(e) = killed {
        tracing::debug!(error = %e, pid = relay.pid, "docker: a relay was not killed");
    }
}

/// Kills pid `$ARGV[0]` if its start time (field 22 of its stat) is `$ARGV[1]`.
const KILL_PL: &str = r#"my ($pid, $start) = @ARGV;
open(my $stat, '<', "/proc/$pid/stat") or exit 0;
my $line = <$stat> // exit 0;
$line =~ s/^.*\) // or exit 0;
kill('KILL', $pid) if (split(' ', $line))[19] eq $start;
"#;

/// The relay's first line (without the newline) and what came after it.
async fn first_line(output: &mut ExecOutput) -> Result<(Vec<u8>, Bytes), String> {
    let mut line = Vec::new();
    loop {
        match output.next().await {
            Some(Ok(LogOutput::StdOut { message })) => {
                line.extend_from_slice(&message);
                if let Some(end) = line.iter().position(|&b| b == b'\n') {
                    let rest = Bytes::copy_from_slice(&line[end + 1..]);
                    line.truncate(end);
                    return Ok((line, rest));
                }
                if line.len() > ANSWER_BYTES {
                    return Err("the relay's answer is not a line".into());
                }
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(e.to_string()),
            None => {
                return Err("the relay ended without an answer (the container may be out of processes or memory)".into());
            }
        }
    }
}

impl Relayed {
    /// The relay's first line (without the newline); what follows it stays pending.
    async fn first_line(&mut self) -> EnvResult<Vec<u8>> {
        let (line, rest) = first_line(&mut self.output)
            .await
            .map_err(|why| unavailable(format!("connect to {}: {why}", self.endpoint)))?;
        self.pending = rest;
        Ok(line)
    }
}

impl AsyncRead for Relayed {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.pending.is_empty() {
                let n = this.pending.len().min(buf.remaining());
                buf.put_slice(&this.pending[..n]);
                this.pending.advance(n);
                return Poll::Ready(Ok(()));
            }
            match Pin::new(&mut this.output).poll_next(cx) {
                Poll::Ready(Some(Ok(LogOutput::StdOut { message }))) => this.pending = message,
                Poll::Ready(Some(Ok(_))) => {}
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(io::Error::other(e))),
                // The relay ended: the service closed its side.
                Poll::Ready(None) => {
                    this.ended = true;
                    return Poll::Ready(Ok(()));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl AsyncWrite for Relayed {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().input.as_mut().poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().input.as_mut().poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().input.as_mut().poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::process::{Child, Command, Stdio};

    use super::*;

    /// The relay, run here on the host by the system's perl, for `kind` and `whereto`.
    fn relay(kind: &str, whereto: &str) -> (Child, BufReader<std::process::ChildStdout>) {
        let mut child = Command::new("perl")
            .args(["-e", RELAY_PL])
            .args([&NR_PRCTL.to_string(), &NR_SECCOMP.to_string(), filter_hex()])
            .args([kind, whereto])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("perl runs the relay");
        let out = BufReader::new(child.stdout.take().unwrap());
        (child, out)
    }

    fn first_line(out: &mut BufReader<std::process::ChildStdout>) -> String {
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        line
    }

    /// Connected, it carries more than its 64 KiB buffers both ways, passes the host's
    /// end of file on as a half close, delivers everything the service sent after it,
    /// and ends when the service closes.
    #[test]
    fn the_relay_carries_bytes_both_ways_and_passes_on_a_half_close() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (mut child, mut out) = relay("port", &port.to_string());
        let (mut service, _) = listener.accept().unwrap();
        assert!(first_line(&mut out).starts_with("+ "));
        let sent: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let mut stdin = child.stdin.take().unwrap();
        let upload = {
            let sent = sent.clone();
            std::thread::spawn(move || {
                stdin.write_all(&sent).unwrap();
                // Dropped: end of file, which the service sees as a half close.
            })
        };
        let mut received = Vec::new();
        service.read_to_end(&mut received).unwrap();
        upload.join().unwrap();
        assert!(
            received == sent,
            "{} bytes of {}",
            received.len(),
            sent.len()
        );
        // The service answers after the client's half close, then closes.
        let answer: Vec<u8> = (0..200_000u32).map(|i| (i % 241) as u8).collect();
        service.write_all(&answer).unwrap();
        drop(service);
        let mut back = Vec::new();
        out.read_to_end(&mut back).unwrap();
        assert!(back == answer, "{} bytes of {}", back.len(), answer.len());
        assert!(child.wait().unwrap().success());
    }

    #[test]
    fn the_relay_says_why_it_could_not_connect() {
        // A port nothing listens on: bound, then closed.
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let (mut child, mut out) = relay("port", &port.to_string());
        let line = first_line(&mut out);
        let refused = answer(&Endpoint::Port(port), line.as_bytes()).unwrap_err();
        assert_eq!(refused.code, ErrorCode::Unavailable, "{line}");
        assert!(!child.wait().unwrap().success());

        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("none.sock");
        let (mut child, mut out) = relay("socket", missing.to_str().unwrap());
        let line = first_line(&mut out);
        let absent = answer(&Endpoint::Socket(missing), line.as_bytes()).unwrap_err();
        assert_eq!(absent.code, ErrorCode::NotFound, "{line}");
        assert!(!child.wait().unwrap().success());
    }

    /// A service that never accepts, its queue full: the relay says so at once and
    /// ends, rather than waiting on it for good.
    #[test]
    fn a_relay_to_a_service_that_never_accepts_ends() {
        use std::os::fd::FromRawFd;
        use std::os::unix::ffi::OsStrExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("full.sock");
        // SAFETY: a new socket, bound and listening with a queue of none; owned below.
        let listener = unsafe {
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            assert!(fd >= 0);
            let mut address: libc::sockaddr_un = std::mem::zeroed();
            address.sun_family = libc::AF_UNIX as libc::sa_family_t;
            for (i, b) in path.as_os_str().as_bytes().iter().enumerate() {
                address.sun_path[i] = *b as libc::c_char;
            }
            let size = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
            assert_eq!(libc::bind(fd, (&raw const address).cast(), size), 0);
            assert_eq!(libc::listen(fd, 0), 0);
            std::os::fd::OwnedFd::from_raw_fd(fd)
        };
        let mut first = None;
        let mut answers = Vec::new();
        for _ in 0..3 {
            let (child, mut out) = relay("socket", path.to_str().unwrap());
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || tx.send(first_line(&mut out)));
            let line = rx
                .recv_timeout(Duration::from_secs(20))
                .expect("the relay answers");
            answers.push(line.clone());
            if first.is_none() {
                first = Some(child);
            } else {
                let mut child = child;
                assert!(!child.wait().unwrap().success(), "{answers:?}");
            }
        }
        assert!(answers[0].starts_with("+ "), "{answers:?}");
        let full = answer(&Endpoint::Socket(path), answers[2].as_bytes()).unwrap_err();
        assert_eq!(full.code, ErrorCode::Unavailable, "{answers:?}");
        if let Some(mut first) = first {
            let _ = first.kill();
            let _ = first.wait();
        }
        drop(listener);
    }

    /// The kill takes a pid only while it is the process that answered: another start
    /// time (the pid taken again) is left alone.
    #[test]
    fn a_kill_spares_a_pid_taken_again() {
        let mut target = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = target.id();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let start: u64 = stat
            .rsplit_once(") ")
            .unwrap()
            .1
            .split(' ')
            .nth(19)
            .unwrap()
            .parse()
            .unwrap();
        let kill = |start: u64| {
            let ran = Command::new("perl")
                .args(["-e", KILL_PL, &pid.to_string(), &start.to_string()])
                .status()
                .unwrap();
            assert!(ran.success());
        };
        kill(start + 1);
        // A SIGKILL sent would have ended it by now.
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            target.try_wait().unwrap().is_none(),
            "another start time was killed"
        );
        kill(start);
        let status = target.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
    }

    #[test]
    fn the_relay_reaches_a_unix_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("app.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let (mut child, mut out) = relay("socket", path.to_str().unwrap());
        let (mut service, _) = listener.accept().unwrap();
        assert!(first_line(&mut out).starts_with("+ "));
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"ping").unwrap();
        drop(stdin);
        let mut got = Vec::new();
        service.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"ping");
        service.write_all(b"pong").unwrap();
        drop(service);
        let mut back = Vec::new();
        out.read_to_end(&mut back).unwrap();
        assert_eq!(back, b"pong");
        assert!(child.wait().unwrap().success());
    }

    #[test]
    fn the_relays_answer_says_connected_or_why_not() {
        let endpoint = Endpoint::Port(8080);
        assert_eq!(
            answer(&endpoint, b"+ 42 1234").ok(),
            Some(RelayId {
                pid: 42,
                start: 1234
            })
        );
        // Not a pid a kill may be sent to: 0 is the killer's group, -1 everyone's.
        for odd in [
            &b"+"[..],
            b"+ 42",
            b"+ 0 1",
            b"+ 1 1",
            b"+ 4294967295 1",
            b"+ 42 x",
        ] {
            assert!(answer(&endpoint, odd).is_err(), "{odd:?}");
        }
        let refused = answer(&endpoint, b"- 111 127.0.0.1:8080: Connection refused").unwrap_err();
        assert_eq!(refused.code, ErrorCode::Unavailable);
        assert!(refused.message.contains("Connection refused"), "{refused}");
        let missing = answer(&endpoint, b"- 2 /workspace/x.sock: No such file").unwrap_err();
        assert_eq!(missing.code, ErrorCode::NotFound);
        let odd = answer(&endpoint, b"hello").unwrap_err();
        assert_eq!(odd.code, ErrorCode::Unavailable);
        assert!(odd.message.contains("\"hello\""), "{odd}");
    }
}
