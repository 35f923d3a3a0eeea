//! Egress for a docker sandbox (DESIGN.md §2.8): the container keeps `NetworkMode
//! none` (only `lo`). skillbox joins the container's network namespace from a thread
//! of its own, makes a socket listening on `127.0.0.1:3128` there, and serves it with
//! the sandbox's proxy from its own namespace, before any of the sandbox's code runs.
//! That takes a local daemon (the container's init is a process skillbox can see) and
//! root (joining a namespace another process made); otherwise, and under runsc (whose
//! network stack is gVisor's own, not the namespace's), a network policy is refused.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use skillbox_egress::{Proxy, Resolve};
use skillbox_env::{EnvError, EnvResult, SandboxPolicy};

use crate::container::Container;
use crate::runtime::Runtime;

fn unavailable(why: impl std::fmt::Display) -> EnvError {
    EnvError::unavailable(format!("egress: {why}"))
}

/// The sandbox's proxy for `policy`, listening in `container`'s network namespace and
/// served until the container is removed; `None` without egress.
pub(crate) async fn attach(
    container: &Container,
    policy: &SandboxPolicy,
    resolver: Arc<dyn Resolve>,
) -> EnvResult<Option<Proxy>> {
    let proxy =
        skillbox_egress::proxy_for(policy.network.as_ref(), policy.egress_bytes, resolver, None)
            .map_err(|e| EnvError::invalid(e.to_string()))?;
    let Some(proxy) = proxy else {
        return Ok(None);
    };
    if container.runtime == Runtime::Runsc {
        return Err(unavailable(
            "the gvisor backend has no egress proxy yet (gVisor's network stack is its own); use native or docker",
        ));
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(unavailable(
            "on docker, skillbox listens in the container's network namespace, which needs root; run skillbox as root or use the native backend",
        ));
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
    let (serving, until) = (proxy.clone(), container.shutdown.clone());
    tokio::spawn(async move { serving.serve_until(listener, until).await });
    Ok(Some(proxy))
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
