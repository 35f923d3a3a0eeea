//! `docker` and `gvisor`: a sandbox is one hardened container, driven through the Docker
//! Engine API (`bollard`), never the docker CLI. `gvisor` is the same container under the
//! `runsc` runtime, which puts a user-space kernel between the code and the host's.
//!
//! What a sandbox container gets (each checked against `docker inspect` by the tests):
//! no network, a read-only root, a non-root user, size-limited tmpfs `/tmp` and
//! `/workspace`, every capability dropped, `no-new-privileges`, Docker's default seccomp
//! profile, memory = memory+swap, CPU and pids limits, no host mounts but the ones the
//! policy names. Inside it, skillbox's own pid 1 ([`helpers/init.pl`]) reaps orphans and
//! kills everything else on request; every exec runs under a wrapper
//! ([`helpers/exec.pl`]) that adds skillbox's own seccomp filter (`skillbox-seccomp`,
//! the one native installs too) on top of Docker's and reports exactly how the command
//! ended.
//!
//! Execs in one sandbox run one at a time: when one ends, whatever it left running (a
//! double-forked daemon) is killed before the next starts. File operations run inside
//! the container as the sandbox's user ([`helpers/fs.py`]), so they see exactly what the
//! sandbox's processes see.
//!
//! If the daemon is down, its socket is not accessible, `runsc` is not registered or the
//! image is missing, creating a sandbox fails with `unavailable` saying which and how to
//! fix it. Nothing falls back to another backend.

//!
//! The modules, each using only those above it: `runtime` (runc or runsc, and what the
//! helpers run with), `daemon` (reaching it, its errors, running a helper command),
//! `config` (the container a spec makes), `container` (one started container's state),
//! `reset` (killing what runs in it), `sandbox` (the `DockerSandbox`), `pool` (starting
//! containers, and the warm pool), `outcome` (how an exec ended, as data), `connect`
//! (reaching what an exec serves, through a relay in the container), `exec` and
//! `files` (the `Shell` and `FileSystem` of a sandbox), `backend` (`DockerBackend`),
//! `image` (`skillbox image build`).

mod backend;
mod bridge;
mod config;
mod connect;
mod container;
mod daemon;
mod egress;
mod exec;
mod files;
mod image;
mod outcome;
mod pool;
mod reset;
mod runtime;
mod sandbox;

pub use backend::{DockerBackend, probe, sweep_left_behind};
pub use image::{BuildInputs, ImageBuilder, image_tag};
pub use runtime::Runtime;
pub use sandbox::DockerSandbox;

/// The uid and gid code runs as inside a sandbox container: not root, and not a user
/// that exists on a typical host (1000 usually does).
pub const SANDBOX_UID: u32 = 65532;

/// Labels on every container skillbox makes.
pub const LABEL_SANDBOX: &str = "dev.skillbox.sandbox";
/// `<boot id>/<pid>/<start time>` of the skillbox process that owns a container.
pub const LABEL_OWNER: &str = "dev.skillbox.owner";
