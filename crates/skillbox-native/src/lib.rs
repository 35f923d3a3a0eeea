//! `native`: the Linux sandbox skillbox uses when nothing else is asked for. No daemon:
//! one `clone3` into new user, pid, net, mount, ipc and uts namespaces (the cgroup
//! namespace init makes once it is in its cgroups), a fresh root with read-only system
//! directories, Landlock, seccomp, cgroups and rlimits.
//!
//! If a layer cannot be applied the sandbox is refused with `unavailable` naming it;
//! it never runs with less than asked.

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
