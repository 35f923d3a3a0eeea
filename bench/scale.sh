#!/usr/bin/env bash
# How skillbox grows past one machine, on this one: POST /v1/run throughput through
# HAProxy with 1, 2 and 3 nodes on one Postgres and one moto bucket (the cluster of
# scripts/cluster.sh), beside one server alone on SQLite and its data dir, with `ab`
# (ApacheBench) at a fixed concurrency, the rows in rounds of alternating order; where
# the CPU went in each row (nodes and their sandboxes, Postgres, moto, HAProxy); a run
# through the balancer against one straight to a node; and the memory of 500 idle
# sessions on one node.
#
#   bench/scale.sh [BINARY]            # as root; the release binary (scripts/dist.sh)
#   ROUNDS=3 REQUESTS=400 CONCURRENCY=8 bench/scale.sh BINARY
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${BENCH_CLEAN_ENV:-}" ]; then
  exec env -i BENCH_CLEAN_ENV=1 PATH="$PATH" HOME="$HOME" ROUNDS="${ROUNDS:-}" \
    REQUESTS="${REQUESTS:-}" CONCURRENCY="${CONCURRENCY:-}" SESSIONS="${SESSIONS:-}" \
    CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-}" "$0" "$@"
fi
[ -n "${CARGO_TARGET_DIR:-}" ] || unset CARGO_TARGET_DIR
command -v ab >/dev/null || {
  [ "$(id -u)" = 0 ] && apt-get install -y -qq apache2-utils >/dev/null ||
    { echo "bench/scale.sh: needs ab (apt-get install apache2-utils)" >&2; exit 1; }
}
bin=${1:-$(scripts/dist.sh)}
export CLUSTER_SERVE_FLAGS="--max-sessions 600 --tenant-max-sessions 600"
exec scripts/cluster.sh "$bin" -- python3 bench/scale.py
