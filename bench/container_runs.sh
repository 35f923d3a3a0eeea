#!/usr/bin/env bash
# One POST /v1/run after another (a trivial Node script that writes one file) on the
# docker and gvisor backends, with and without a pool of started containers
# (`serve --warm-containers`), native for scale. Two servers on one data dir, measured
# side by side in one hyperfine run. Writes bench/results/container_runs.md.
#
#   bench/container_runs.sh          # 30 runs each
#   RUNS=60 bench/container_runs.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
if [ -z "${BENCH_CLEAN_ENV:-}" ]; then
  exec env -i BENCH_CLEAN_ENV=1 PATH="$PATH" HOME="$HOME" RUNS="${RUNS:-}" "$0" "$@"
fi
runs=${RUNS:-30}
runs=${runs:-30}
for tool in hyperfine curl python3; do
  command -v "$tool" >/dev/null || { echo "bench/container_runs.sh: $tool is missing" >&2; exit 1; }
done
skillbox=$(scripts/dist.sh)
data=${SKILLBOX_BENCH_DATA:-$PWD/target/bench-data}
mkdir -p "$data"
"$skillbox" --data-dir "$data" setup >/dev/null 2>&1
cold=$(free_port)
warm=$(free_port)
"$skillbox" --data-dir "$data" serve --addr "127.0.0.1:$cold" --warm-containers 0 2>/dev/null &
cold_pid=$!
"$skillbox" --data-dir "$data" serve --addr "127.0.0.1:$warm" --warm-containers 2 2>/dev/null &
warm_pid=$!
body=$(mktemp)
trap 'kill $cold_pid $warm_pid 2>/dev/null; wait $cold_pid $warm_pid 2>/dev/null; rm -f "$body" "$body".*' EXIT
for port in $cold $warm; do
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break
    sleep 0.1
  done
done

request() { # backend port
  printf '{"script":"require(\\"fs\\").writeFileSync(\\"hi.txt\\",\\"hi\\")","language":"node","backend":"%s"}' "$1" > "$body.$1"
  # Fails the benchmark (curl -f) on any error answer.
  echo "curl -sf -o /dev/null -X POST http://127.0.0.1:$2/v1/run -H content-type:application/json -d @$body.$1"
}
rows=(-n "native" "$(request native "$cold")")
for backend in docker gvisor; do
  ok=$(curl -s -X POST "http://127.0.0.1:$cold/v1/run" -H content-type:application/json \
    -d "{\"script\":\"0\",\"language\":\"node\",\"backend\":\"$backend\"}" | python3 -c 'import json,sys; print("exitCode" in json.load(sys.stdin))')
  if [ "$ok" = True ]; then
    # Once used, the warm server's pool fills for this backend.
    curl -s -o /dev/null -X POST "http://127.0.0.1:$warm/v1/run" -H content-type:application/json \
      -d "{\"script\":\"0\",\"language\":\"node\",\"backend\":\"$backend\"}"
    rows+=(-n "$backend, no pool" "$(request "$backend" "$cold")"
           -n "$backend, --warm-containers 2" "$(request "$backend" "$warm")")
  fi
done
sleep 3

out=bench/results/container_runs.md
mkdir -p bench/results
json=$(mktemp)
hyperfine -N --warmup 3 --runs "$runs" --export-json "$json" "${rows[@]}" >/dev/null 2>&1
{
  echo "Machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -sr), $(docker version --format 'Docker {{.Server.Version}}' 2>/dev/null || echo 'no Docker')"
  echo "Date: $(date -u +%Y-%m-%d), hyperfine, $runs runs each, one request at a time"
  echo
  echo "| POST /v1/run | median | mean ± σ | min | max |"
  echo "|---|---:|---:|---:|---:|"
  python3 - "$json" <<'PY'
import json, statistics, sys
for r in json.load(open(sys.argv[1]))["results"]:
    t = r["times"]
    ms = lambda s: f"{s * 1000:.0f} ms"
    print(f"| {r['command']} | {ms(statistics.median(t))} | {ms(statistics.mean(t))} ± {ms(statistics.stdev(t))} | {ms(min(t))} | {ms(max(t))} |")
PY
} > "$out"
rm -f "$json"
cat "$out"
