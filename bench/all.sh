#!/usr/bin/env bash
# Issue 16's table in one command: every speed bar skillbox holds itself to, each
# measured side by side with its yardstick in the same run (paired rounds, clean
# environment, skillbox's default limits on), with the date and the machine.
# Writes bench/results/all.md and prints it.
#
#   bench/all.sh                       # about 10 minutes on 2 cores
#   QUICK=1 bench/all.sh               # fewer samples, for a smoke check
#
# Needs hyperfine, bwrap and node (scripts/test.sh installs them); the container rows
# need dockerd and the runtime image (`skillbox image build`), gVisor's runsc for its
# rows. Missing parts are skipped with a note in the table, never faked.
set -euo pipefail
cd "$(dirname "$0")/.."
# A clean environment for every contender: an inherited NODE_EXTRA_CA_CERTS alone adds
# tens of ms to a bare `node -e 0`.
if [ -z "${BENCH_CLEAN_ENV:-}" ]; then
  exec env -i BENCH_CLEAN_ENV=1 PATH="$PATH" HOME="$HOME" QUICK="${QUICK:-}" \
    SKILLBOX_BENCH_DATA="${SKILLBOX_BENCH_DATA:-}" "$0" "$@"
fi
for tool in hyperfine bwrap node python3; do
  command -v "$tool" >/dev/null || { echo "bench/all.sh: $tool is missing (scripts/test.sh installs it)" >&2; exit 1; }
done
echo "bench/all.sh: building the release binary (scripts/dist.sh)" >&2
skillbox=$(scripts/dist.sh)
data=${SKILLBOX_BENCH_DATA:-$PWD/target/bench-data}
mkdir -p "$data"
echo "bench/all.sh: skillbox setup (the Node runtime; once)" >&2
"$skillbox" --data-dir "$data" setup --no-wasm >/dev/null
exec python3 bench/all.py "$skillbox" "$data"
