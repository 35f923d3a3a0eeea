#!/usr/bin/env bash
# Throughput and latency of POST /v1/run with a trivial Node script, at concurrency 1, 2
# and 8 (wrk), next to how fast this machine can spawn bare `node -e 0` at the same
# concurrency. Writes bench/results/run_api.md and prints it.
#
#   bench/run_api.sh                 # 15 s per point
#   DURATION=30 bench/run_api.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${BENCH_CLEAN_ENV:-}" ]; then
  exec env -i BENCH_CLEAN_ENV=1 PATH="$PATH" HOME="$HOME" DURATION="${DURATION:-}" MAX_CONCURRENCY="${MAX_CONCURRENCY:-}" "$0" "$@"
fi
duration=${DURATION:-15}
duration=${duration:-15}
for tool in wrk node python3; do
  command -v "$tool" >/dev/null || { echo "bench/run_api.sh: $tool is missing (apt-get install wrk)" >&2; exit 1; }
done
cargo build --release -q -p skillbox
skillbox=$PWD/target/release/skillbox
data=${SKILLBOX_BENCH_DATA:-$PWD/target/bench-data}
mkdir -p "$data"
"$skillbox" --data-dir "$data" setup >/dev/null 2>&1
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$skillbox" --data-dir "$data" serve --addr "127.0.0.1:$port" ${MAX_CONCURRENCY:+--max-concurrency $MAX_CONCURRENCY} --max-queue 256 2>/dev/null &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -f "$lua"' EXIT
lua=$(mktemp --suffix=.lua)
cat > "$lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"script":"0","language":"node"}'
done = function(summary, latency, requests)
  local errors = summary.errors.status + summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout
  io.write(string.format("RESULT %.2f %.1f %.1f %d\n", summary.requests / (summary.duration / 1e6),
    latency:percentile(50) / 1000, latency:percentile(99) / 1000, errors))
end
LUA
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break
  sleep 0.1
done

# Bare spawns/s: `node -e 0` from P parallel loops for the same duration.
bare() {
  local p=$1
  python3 - "$p" "$duration" <<'PY'
import subprocess, sys, threading, time
p, duration = int(sys.argv[1]), float(sys.argv[2])
count = [0] * p
end = time.monotonic() + duration
def loop(i):
    while time.monotonic() < end:
        subprocess.run(["node", "-e", "0"], check=True)
        count[i] += 1
threads = [threading.Thread(target=loop, args=(i,)) for i in range(p)]
start = time.monotonic()
[t.start() for t in threads]; [t.join() for t in threads]
print(f"{sum(count) / (time.monotonic() - start):.2f}")
PY
}

out=bench/results/run_api.md
mkdir -p bench/results
{
  echo "Machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -sr), $(node --version), user: $(id -un); server: --max-concurrency ${MAX_CONCURRENCY:-$(nproc) (default)}, cgroup v1 limits on"
  echo "Date: $(date -u +%Y-%m-%d), wrk, ${duration}s per point, script \`0\` (node)"
  echo
  echo "| concurrency | POST /v1/run req/s | p50 | p99 | errors | bare \`node -e 0\` spawns/s | ratio |"
  echo "|---:|---:|---:|---:|---:|---:|---:|"
} > "$out"
for c in 1 2 8; do
  read -r rps p50 p99 errors < <(wrk -t1 -c"$c" -d"${duration}s" --timeout 30s -s "$lua" "http://127.0.0.1:$port/v1/run" | awk '/^RESULT/ {print $2, $3, $4, $5}')
  spawns=$(bare "$c")
  ratio=$(python3 -c "print(f'{$rps / $spawns:.0%}')")
  echo "| $c | $rps | ${p50} ms | ${p99} ms | $errors | $spawns | $ratio |" >> "$out"
done
cat "$out"
