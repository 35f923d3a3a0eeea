#!/usr/bin/env bash
# Two skillbox binaries side by side on POST /v1/run (a Node script that writes one
# file), paired: each round sends one request to A then one to B (the order swapped
# every other round), each server with its warm pool, on the backends given. For a
# change's before and after in one run.
#
#   bench/ab_runs.sh OLD_BINARY NEW_BINARY                # docker and gvisor, 40 rounds
#   ROUNDS=60 BACKENDS="docker native" bench/ab_runs.sh A B
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
if [ -z "${BENCH_CLEAN_ENV:-}" ]; then
  exec env -i BENCH_CLEAN_ENV=1 PATH="$PATH" HOME="$HOME" ROUNDS="${ROUNDS:-}" BACKENDS="${BACKENDS:-}" "$0" "$@"
fi
[ $# = 2 ] || { echo "usage: bench/ab_runs.sh BINARY_A BINARY_B" >&2; exit 2; }
a=$1 b=$2
rounds=${ROUNDS:-40}; rounds=${rounds:-40}
backends=${BACKENDS:-docker gvisor}; backends=${backends:-docker gvisor}
data=${SKILLBOX_BENCH_DATA:-$PWD/target/bench-data}
mkdir -p "$data"
"$b" --data-dir "$data" setup --no-wasm >/dev/null 2>&1
pa=$(free_port); pb=$(free_port)
"$a" --data-dir "$data" serve --addr "127.0.0.1:$pa" --warm-containers 2 2>/dev/null & apid=$!
"$b" --data-dir "$data" serve --addr "127.0.0.1:$pb" --warm-containers 2 2>/dev/null & bpid=$!
trap 'kill $apid $bpid 2>/dev/null; wait $apid $bpid 2>/dev/null' EXIT
for port in $pa $pb; do
  for _ in $(seq 300); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
done
python3 - "$pa" "$pb" "$rounds" "$a" "$b" $backends <<'PY'
import http.client, json, statistics, sys, time
pa, pb, rounds, a, b, *backends = sys.argv[1:]
rounds = int(rounds)
script = 'require("fs").writeFileSync("hi.txt","hi")'

def run(port, backend):
    conn = http.client.HTTPConnection("127.0.0.1", int(port), timeout=120)
    body = json.dumps({"script": script, "language": "node", "backend": backend})
    start = time.perf_counter()
    conn.request("POST", "/v1/run", body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    elapsed = time.perf_counter() - start
    conn.close()
    result = json.loads(data)
    if response.status != 200 or result.get("exitCode") != 0 or len(result.get("files", [])) != 1:
        sys.exit(f":{port} {backend}: {response.status} {data[:300]!r}")
    return elapsed * 1000

print(f"A = {a}\nB = {b}\n{rounds} paired rounds a backend, warm pools of 2, 0.5 s between requests\n")
print("| backend | A median | B median | B / A |")
print("|---|---:|---:|---:|")
for backend in backends:
    times = {pa: [], pb: []}
    for _ in range(3):  # warm-up
        run(pa, backend); time.sleep(0.5); run(pb, backend); time.sleep(0.5)
    for r in range(rounds):
        for port in ((pa, pb) if r % 2 == 0 else (pb, pa)):
            times[port].append(run(port, backend))
            time.sleep(0.5)  # the pool refills, untimed
    ma, mb = statistics.median(times[pa]), statistics.median(times[pb])
    print(f"| {backend} | {ma:.0f} ms | {mb:.0f} ms | {mb / ma:.2f} |")
PY
