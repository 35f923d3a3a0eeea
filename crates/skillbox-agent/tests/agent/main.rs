//! skillbox-agent's integration tests: one binary.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

mod corrections;
mod interop;
mod loop_edges;
mod model_check;
mod openai;
mod skills;
