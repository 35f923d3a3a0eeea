//! `native`: the Linux sandbox skillbox uses when nothing else is asked for. No daemon:
//! one `clone3` into new user, pid, net, mount, ipc and uts namespaces (the cgroup
//! namespace init makes once it is in its cgroups), a fresh root with read-only system
//! directories, Landlock, seccomp, cgroups and rlimits.
//!
//! If a layer cannot be applied the sandbox is refused with `unavailable` naming it;
//! it never runs with less than asked.
//!
//! The modules, each using only those above it (unit tests aside: exec's make their
//! sandbox with `NativeBackend`): `ids` (the sandbox user's ids, inside and on the
//! host), `landlock` (the ruleset, planned here, applied by init), `cgroup` (per-exec
//! cgroups), `idmap` (idmapped mounts), `trees` (bind sources captured as detached
//! mounts), `connect` (reaching what an exec serves), `egress` (the proxy's listener in
//! an exec's network), `child` (the code init runs after the clone), `scratch` (the
//! sandbox's own tmpfs), `layout` (the root's plan and `/etc`), `clone` (the one
//! `clone3` of an init), `spawner` (the spawner process: `wire`, `client`, `server`),
//! `spawn` (starting an init: pipes, maps, the go-ahead, the spawner thread), `probe`
//! (what this host gives), `sandbox` (the `NativeSandbox`), `create` (making one from a
//! spec), `exec` (its `Shell`), `fs` (its `FileSystem`), `warm` (sandboxes made ahead),
//! `backend` (`NativeBackend`).

mod backend;
mod cgroup;
mod child;
mod clone;
mod connect;
mod create;
mod egress;
mod exec;
mod fs;
mod idmap;
mod ids;
mod landlock;
mod layout;
mod probe;
mod sandbox;
mod scratch;
mod spawn;
mod spawner;
mod trees;
mod warm;

pub use backend::NativeBackend;
pub use layout::shown_read_only;
pub use probe::probe;
pub use sandbox::NativeSandbox;
#[doc(hidden)]
pub use scratch::keep_in_namespaces_for_tests;
pub use warm::WarmStats;

/// The spawner process: a long-lived caller (the server) has sandboxes cloned by a
/// small copy of its program instead of by itself.
pub mod spawner_process {
    pub use crate::spawn::use_spawner_process as start;
    pub use crate::spawner::server::main;
    pub use crate::spawner::wire::SUBCOMMAND;
}
