//! The spawner process: a small copy of this program that a long-lived caller (the
//! server) starts once and asks to clone each sandbox's init.
//!
//! A clone copies the page tables of the process that makes it, and init's exit tears
//! that copy down again. Cloned from the server, that is the server's heaps and its
//! threads' stacks, twice per run; cloned from this process, a few MiB. Only the clone
//! moves here: the server's spawner thread still writes the uid/gid maps, opens the
//! exec's namespaces, makes the egress listener, opens the cgroup files (v2's leaf to
//! be born in, v1's `tasks` files for init to join) and sends the go-ahead bytes,
//! exactly as when it clones init itself.
//!
//! The two talk over a socketpair (this process's stdin). A request is the plan,
//! encoded, with its fds attached (`SCM_RIGHTS`); the answer is init's pid with its
//! pidfd, or what failed. Init is cloned with `CLONE_PARENT`: it is the server's child,
//! exactly as when the server clones it, reaped by the server, holding its pid until
//! then, and killed when the server's spawner thread exits (its parent-death signal).
//! So this process's own death ends no sandbox.
//!
//! Lifetimes: this process gets `SIGKILL` when the server's spawner thread (which lives
//! as long as the server) exits, and exits at its socket's end. Should it die, the
//! start it was asked for fails and later ones are cloned in the server again (same
//! isolation, slower), with a warning.
//!
//! Three modules, each using only those before it: `wire` (the request and the answer
//! as bytes, and fds over the socket), `client` (the caller's side: starting the
//! spawner process and asking it for a clone) and `server` (the spawner process's
//! side: answering requests).

pub(crate) mod client;
pub(crate) mod server;
pub(crate) mod wire;
