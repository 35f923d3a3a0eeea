#!/usr/bin/env bash
# Two skillbox binaries side by side on POST /v1/run throughput (native, the trivial
# Node script `0`), with bare `node -e 0` spawns as the yardstick, all in one run: per
# concurrency, ROUNDS rounds of A, B, bare in a rotating order, each for SECONDS. For a
# change's before and after.
#
#   bench/ab_api.sh OLD_BINARY NEW_BINARY            # c = 8, 4 rounds of 8 s
#   CONCURRENCY="1 8" ROUNDS=6 bench/ab_api.sh A B
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
if [ -z "${BENCH_CLEAN_ENV:-}" ]; then
  exec env -i BENCH_CLEAN_ENV=1 PATH="$PATH" HOME="$HOME" ROUNDS="${ROUNDS:-}" \
    SECONDS_EACH="${SECONDS_EACH:-}" CONCURRENCY="${CONCURRENCY:-}" "$0" "$@"
fi
[ $# = 2 ] || { echo "usage: bench/ab_api.sh BINARY_A BINARY_B" >&2; exit 2; }
a=$1 b=$2
data=${SKILLBOX_BENCH_DATA:-$PWD/target/bench-data}
mkdir -p "$data"
"$b" --data-dir "$data" setup --no-wasm >/dev/null 2>&1
pa=$(free_port); pb=$(free_port)
"$a" --data-dir "$data" serve --addr "127.0.0.1:$pa" 2>/dev/null & apid=$!
"$b" --data-dir "$data" serve --addr "127.0.0.1:$pb" 2>/dev/null & bpid=$!
trap 'kill $apid $bpid 2>/dev/null; wait $apid $bpid 2>/dev/null' EXIT
for port in $pa $pb; do
  for _ in $(seq 300); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
done
python3 - "$pa" "$pb" "$a" "$b" "${ROUNDS:-4}" "${SECONDS_EACH:-8}" ${CONCURRENCY:-8} <<'PY'
import http.client, json, statistics, subprocess, sys
sys.path.insert(0, "bench")
from common import rate
pa, pb, a, b, rounds, seconds, *levels = sys.argv[1:]
rounds, seconds = int(rounds), float(seconds)

def post(port, state):
    conn = state.get("conn") or http.client.HTTPConnection("127.0.0.1", int(port), timeout=120)
    state["conn"] = conn
    conn.request("POST", "/v1/run", body='{"script":"0","language":"node","backend":"native"}',
                 headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    payload = response.read()
    if response.status != 200 or json.loads(payload).get("exitCode") != 0:
        sys.exit(f":{port}: {response.status} {payload[:300]!r}")

def bare(_state):
    subprocess.run(["node", "-e", "0"], check=True)

workers = {"A": lambda s: post(pa, s), "B": lambda s: post(pb, s), "bare": bare}
print(f"A = {a}\nB = {b}\n{rounds} rounds of {seconds:.0f} s per contender and concurrency, order rotated\n")
print("| concurrency | A req/s | B req/s | bare spawns/s | A / bare | B / bare | B / A |")
print("|---:|---:|---:|---:|---:|---:|---:|")
for level in levels:
    c = int(level)
    for name in ("A", "B"):
        rate(workers[name], c, seconds)  # warm-up, untimed
    got = {name: [] for name in workers}
    order = ["A", "B", "bare"]
    for r in range(rounds):
        for name in order[r % 3:] + order[:r % 3]:
            got[name].append(rate(workers[name], c, seconds))
    ma, mb, mbare = (statistics.median(got[n]) for n in ("A", "B", "bare"))
    print(f"| {c} | {ma:.1f} | {mb:.1f} | {mbare:.1f} | {ma / mbare:.2f} | {mb / mbare:.2f} | {mb / ma:.2f} |",
          flush=True)
PY
