//! The door layer: one place for what crosses a sandbox's edge, for every caller (the
//! server's runs and sessions, MCP, the agent, the capability router, the CLI), so that
//! each rule has one source and each caller is an adapter over it.
//!
//! - [`Workspace`]: a sandbox's workspace through its door: a path a caller gives
//!   parsed by one rule ([`skillbox_protocol::WorkspacePath`] against the sandbox's
//!   root), reads bounded by a cap from one table ([`ReadCaps`]), writes, listings and
//!   removals through the sandbox's own file view, and run-and-collect
//!   ([`Workspace::place_inputs`], [`Workspace::run_and_collect`]) within one
//!   configured [`CollectLimits`];
//! - [`SessionTable`]: the sandboxes kept open across calls (HTTP sessions, MCP
//!   sessions), bounded in all and per tenant by one [`SessionBounds`];
//! - the backend a caller may ask for is a [`skillbox_protocol::SandboxedKind`]: `host`
//!   is refused where a caller's kind is turned into one ([`sandboxed`]).

mod sessions;
mod workspace;

pub use sessions::{Refusal, Reservation, SessionBounds, SessionTable};
pub use skillbox_store::CollectLimits;
pub use workspace::{Collection, DoorConfig, ReadCaps, Workspace, parse_path, sandboxed};
