//! Counters for `/metrics`, in the Prometheus text format.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct Metrics {
    pub runs_ok: AtomicU64,
    pub runs_failed: AtomicU64,
    pub runs_limit_hit: AtomicU64,
    pub runs_error: AtomicU64,
    pub rejected_overloaded: AtomicU64,
    pub in_flight: AtomicU64,
    pub queued: AtomicU64,
    pub run_millis_total: AtomicU64,
    pub artifacts_total: AtomicU64,
    pub artifact_bytes_total: AtomicU64,
    pub connections_open: AtomicU64,
    pub connections_refused: AtomicU64,
    pub connections_refused_per_peer: AtomicU64,
    pub answers_abandoned: AtomicU64,
    pub writes_timed_out: AtomicU64,
}

impl Metrics {
    pub fn render(&self) -> String {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut out = String::new();
        let mut line = |name: &str, kind: &str, help: &str, samples: &[(&str, u64)]| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, value) in samples {
                let _ = writeln!(out, "{name}{labels} {value}");
            }
        };
        line(
            "skillbox_runs_total",
            "counter",
            "Runs answered, by outcome (ok: exit 0; failed: non-zero exit; limit: a limit was hit; error: no run).",
            &[
                ("{outcome=\"ok\"}", get(&self.runs_ok)),
                ("{outcome=\"failed\"}", get(&self.runs_failed)),
                ("{outcome=\"limit\"}", get(&self.runs_limit_hit)),
                ("{outcome=\"error\"}", get(&self.runs_error)),
            ],
        );
        line(
            "skillbox_runs_rejected_total",
            "counter",
            "Runs refused with 429 because the queue was full.",
            &[("", get(&self.rejected_overloaded))],
        );
        line(
            "skillbox_runs_in_flight",
            "gauge",
            "Runs executing now.",
            &[("", get(&self.in_flight))],
        );
        line(
            "skillbox_runs_queued",
            "gauge",
            "Runs waiting for a slot.",
            &[("", get(&self.queued))],
        );
        line(
            "skillbox_run_seconds_total",
            "counter",
            "Wall time spent in runs.",
            &[("", get(&self.run_millis_total) / 1000)],
        );
        line(
            "skillbox_artifacts_total",
            "counter",
            "Artifacts stored.",
            &[("", get(&self.artifacts_total))],
        );
        line(
            "skillbox_artifact_bytes_total",
            "counter",
            "Bytes of artifacts stored.",
            &[("", get(&self.artifact_bytes_total))],
        );
        line(
            "skillbox_connections_open",
            "gauge",
            "HTTP connections open now.",
            &[("", get(&self.connections_open))],
        );
        line(
            "skillbox_connections_refused_total",
            "counter",
            "Connections closed at once because max_connections were open.",
            &[("", get(&self.connections_refused))],
        );
        line(
            "skillbox_connections_refused_per_peer_total",
            "counter",
            "Connections closed at once because their peer had max_connections_per_peer open.",
            &[("", get(&self.connections_refused_per_peer))],
        );
        line(
            "skillbox_writes_timed_out_total",
            "counter",
            "Connections closed because the client took nothing of an answer within the write timeout.",
            &[("", get(&self.writes_timed_out))],
        );
        line(
            "skillbox_answers_abandoned_total",
            "counter",
            "Connections closed because the client had not taken an answer held in memory within the body timeout.",
            &[("", get(&self.answers_abandoned))],
        );
        out
    }
}
