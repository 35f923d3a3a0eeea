//! Egress for a docker or gvisor sandbox (DESIGN.md §8): the container keeps
//! `NetworkMode none` (only `lo`). Under runc skillbox joins the container's network
//! namespace from a thread of its own, makes a socket listening on `127.0.0.1:3128`
//! there, and serves it with the sandbox's proxy from its own namespace, before any of
//! the sandbox's code runs. That takes a local daemon (the container's init is a
//! process skillbox can see) and root (joining a namespace another process made);
//! otherwise a network policy is refused. Under runsc, whose network stack is gVisor's
//! own, a bridge in the sandbox carries the connections over an exec's stdio
//! (`bridge.rs`). A sandbox with secrets gets its CA's files in [`CA_DIR`].

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use rustls_pki_types::CertificateDer;
use skillbox_egress::{Resolve, SandboxEgress, SetupError};
use skillbox_env::{EnvError, EnvResult, SandboxPolicy};

use crate::container::Container;
use crate::runtime::Runtime;

fn unavailable(why: impl std::fmt::Display) -> EnvError {
    EnvError::unavailable(format!("egress: {why}"))
}

/// Where a sandbox with secrets finds its CA: `ca.pem`, and `ca-bundle.pem` (the host's
/// roots and it), made by root before any of the sandbox's code runs (a directory the
/// sandbox's user cannot change, in `/tmp`: the root file system is read-only).
pub(crate) const CA_DIR: &str = "/tmp/.skillbox-egress";

/// Makes [`CA_DIR`]: `ca.pem` from stdin, and `ca-bundle.pem` of the image's own public
/// roots (the first bundle of argv[2:] there) then it; 0755 and 0644, owned by root.
/// Fails if anything is there already, or (exit 4) when the image has no roots.
const WRITE_CA_PY: &str = r#"import os, sys
ca = sys.stdin.buffer.read()
roots = None
for path in sys.argv[2:]:
    try:
        with open(path, "rb") as f:
            roots = f.read()
    except OSError:
        continue
    if b"BEGIN CERTIFICATE" in roots:
        break
    roots = None
if roots is None:
    sys.exit(4)
os.umask(0o022)
os.mkdir(sys.argv[1], 0o755)
for name, body in (("ca.pem", ca), ("ca-bundle.pem", roots + b"\n" + ca)):
    fd = os.open(os.path.join(sys.argv[1], name), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(body)
"#;

/// The sandbox's egress for `policy`, its proxy listening in `container`'s network
/// namespace and served until the container is removed; `None` without egress.
pub(crate) async fn attach(
    container: &Container,
    policy: &SandboxPolicy,
    resolver: Arc<dyn Resolve>,
    upstream_roots: &[CertificateDer<'static>],
) -> EnvResult<Option<SandboxEgress>> {
    let egress = skillbox_egress::sandbox_egress(
        policy.network.as_ref(),
        policy.egress_bytes,
        &policy.secrets,
        resolver,
        upstream_roots,
        CA_DIR,
    )
    .map_err(|e| match e {
        SetupError::Invalid(_) => EnvError::invalid(e.to_string()),
        SetupError::Unavailable(_) => EnvError::unavailable(e.to_string()),
    })?;
    let Some(egress) = egress else {
        return Ok(None);
    };
    // SAFETY: geteuid has no preconditions.
    if container.runtime == Runtime::Runc && unsafe { libc::geteuid() } != 0 {
        return Err(unavailable(
            "on docker, skillbox listens in the container's network namespace, which needs root; run skillbox as root or use the native or gvisor backend",
        ));
    }
    if let Some(ca_pem) = &egress.ca_pem {
        write_ca(container, ca_pem).await?;
    }
    if container.runtime == Runtime::Runsc {
        crate::bridge::attach(container, egress.proxy.clone()).await?;
        return Ok(Some(egress));
    }
    let net = container_netns(container).await?;
    let listener = skillbox_egress::netns::listen_in(net.as_fd()).map_err(|e| {
        unavailable(format!(
            "cannot listen in the container's network namespace: {e}"
        ))
    })?;
    let listener = std::net::TcpListener::from(listener);
    let listener = tokio::net::TcpListener::from_std(listener)
        .map_err(|e| unavailable(format!("the proxy's listener: {e}")))?;
    let (serving, until) = (egress.proxy.clone(), container.shutdown.clone());
    tokio::spawn(async move { serving.serve_until(listener, until).await });
    Ok(Some(egress))
}

/// Writes the CA's files into [`CA_DIR`] as root (the container keeps no capability:
/// root there owns what it makes, nothing more).
async fn write_ca(container: &Container, ca_pem: &str) -> EnvResult<()> {
    let mut argv = vec![
        container.runtime.python().to_string(),
        "-I".into(),
        "-S".into(),
        "-c".into(),
        WRITE_CA_PY.into(),
        CA_DIR.into(),
    ];
    argv.extend(skillbox_egress::ROOT_BUNDLES.iter().map(|p| p.to_string()));
    let out = crate::daemon::collect_exec_as(
        &container.docker,
        &container.id,
        container.runtime.backend(),
        "write the egress CA",
        argv,
        Some(ca_pem.as_bytes().to_vec()),
        Some("0"),
    )
    .await?;
    if out.exit_code == Some(4) {
        return Err(EnvError::unavailable(format!(
            "egress secrets: the image has no bundle of public roots (looked at {}); build it with the ca-certificates package",
            skillbox_egress::ROOT_BUNDLES.join(", ")
        )));
    }
    if out.exit_code != Some(0) {
        return Err(EnvError::unavailable(format!(
            "egress secrets: cannot write the CA at {CA_DIR} in the container (exit {:?}): {}",
            out.exit_code,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// The container's network namespace, through its init's host pid: checked to be that
/// init (a local daemon shows host pids; a remote one's mean nothing here) and not this
/// process's own namespace.
async fn container_netns(container: &Container) -> EnvResult<OwnedFd> {
    let pid: i32 = container
        .init_pid
        .parse()
        .map_err(|_| unavailable("the container's init has no pid here"))?;
    let is_init = || {
        std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.starts_with(b"skillbox-init"))
    };
    // A container just started may not have named itself yet: give it a moment.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while !is_init() {
        if std::time::Instant::now() > deadline {
            return Err(unavailable(
                "the container's init is not a process of this host (a remote DOCKER_HOST, or skillbox in another pid namespace than the daemon?); egress on docker needs a local daemon",
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let net = std::fs::File::open(format!("/proc/{pid}/ns/net"))
        .map_err(|e| unavailable(format!("the container's network namespace: {e}")))?;
    // The pid could have been reused between the look and the open: look again.
    if !is_init() {
        return Err(unavailable("the container's init went away"));
    }
    use std::os::unix::fs::MetadataExt;
    let ours = std::fs::metadata("/proc/self/ns/net").map(|m| m.ino());
    let theirs = net.metadata().map(|m| m.ino());
    if ours.is_err() || theirs.is_err() || ours.ok() == theirs.ok() {
        return Err(unavailable(
            "the container's network namespace is this process's own (or cannot be told apart)",
        ));
    }
    let net: OwnedFd = net.into();
    Ok(net)
}
