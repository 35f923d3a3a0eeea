//! skillbox-agent's integration tests: one binary.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

mod corrections;
mod loop_edges;
mod openai;
mod skills;
