#!/usr/bin/env bash
# Startup cost of one sandboxed command, side by side in one hyperfine run:
# bare spawn, bubblewrap with equivalent binds, and skillbox's native backend
# (with its default cgroup limits, and with no cgroup limits like bwrap).
#
#   bench/startup.sh            # writes bench/results/startup.md and prints it
#   RUNS=300 bench/startup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
# A clean environment for every contender: e.g. NODE_EXTRA_CA_CERTS alone makes a bare
# `node -e 0` parse a CA bundle and look 70 ms slower than a sandboxed one.
if [ -z "${BENCH_CLEAN_ENV:-}" ]; then
  exec env -i BENCH_CLEAN_ENV=1 PATH="$PATH" HOME="$HOME" RUNS="${RUNS:-}" ROUNDS="${ROUNDS:-}" \
    CONTAINER_RUNS="${CONTAINER_RUNS:-}" SKILLBOX_WASM_HOME="${SKILLBOX_WASM_HOME:-$PWD/target/wasm-home}" "$0" "$@"
fi

runs=${RUNS:-200}
runs=${runs:-200}
rounds=${ROUNDS:-4}
rounds=${rounds:-4}
for tool in hyperfine bwrap node; do
  command -v "$tool" >/dev/null || { echo "bench/startup.sh: $tool is missing (scripts/test.sh installs it)" >&2; exit 1; }
done
# The release binary (static-pie, scripts/dist.sh), and for comparison the dynamic
# one `cargo build --release` makes.
skillbox=$(scripts/dist.sh)
cargo build --release -q -p skillbox
dynamic=$PWD/target/release/skillbox
data=$(mktemp -d)
ws=$(mktemp -d)
trap 'rm -rf "$data" "$ws"' EXIT
chmod 755 "$ws"
[ "$(id -u)" = 0 ] && chown 65534:65534 "$ws"

# bwrap with the same view skillbox gives: read-only /usr (+ merged-usr symlinks),
# its own /proc, /dev and /tmp, the workspace read-write, every namespace.
bwrap_cmd="bwrap --unshare-all --die-with-parent --new-session \
  --ro-bind /usr /usr --symlink usr/bin /bin --symlink usr/lib /lib --symlink usr/lib64 /lib64 --symlink usr/sbin /sbin \
  --ro-bind /etc/ld.so.cache /etc/ld.so.cache --ro-bind /etc/ssl/certs /etc/ssl/certs \
  --proc /proc --dev /dev --tmpfs /tmp --bind $ws /workspace --chdir /workspace"
sb="$skillbox --data-dir $data exec"
sb_dynamic="$dynamic --data-dir $data exec"

mkdir -p bench/results
out=bench/results/startup.md
{
  echo "Machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -sr), $(. /etc/os-release; echo "$PRETTY_NAME"), cgroup: $("$skillbox" doctor --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["backends"][0]["layers"]["cgroup"]["detail"])'), user: $(id -un)"
  echo "Date: $(date -u +%Y-%m-%d), hyperfine $(hyperfine --version | awk '{print $2}'), $runs runs each, pooled from $rounds rounds"
  echo
} > "$out"

# Runs the contenders in several rounds (hyperfine times one command fully before the
# next, so on a noisy machine a slow minute would hit just one of them) and pools the
# samples of every round.
run() {
  local title=$1; shift
  local dir
  dir=$(mktemp -d)
  for round in $(seq "$rounds"); do
    hyperfine -N --warmup 5 --runs $((runs / rounds)) --export-json "$dir/$round.json" "$@" >/dev/null 2>&1
  done
  {
    echo "### $title"
    echo
    echo "| command | median | mean ± σ | min | max |"
    echo "|---|---:|---:|---:|---:|"
    python3 - "$dir" <<'PY'
import json, os, statistics, sys
pooled = {}
for name in sorted(os.listdir(sys.argv[1])):
    for r in json.load(open(os.path.join(sys.argv[1], name)))["results"]:
        pooled.setdefault(r["command"], []).extend(r["times"])
for command, times in pooled.items():
    ms = lambda s: f"{s * 1000:.2f} ms"
    print(f"| `{command}` | {ms(statistics.median(times))} | {ms(statistics.mean(times))} ± {ms(statistics.stdev(times))} | {ms(min(times))} | {ms(max(times))} |")
PY
    echo
  } >> "$out"
  rm -rf "$dir"
}

run "/bin/true" \
  -n "bare" "/bin/true" \
  -n "bwrap" "$bwrap_cmd /bin/true" \
  -n "skillbox native (no cgroup limits)" "$sb --memory none --pids none -- /bin/true" \
  -n "skillbox native (no cgroup limits), dynamic build" "$sb_dynamic --memory none --pids none -- /bin/true" \
  -n "skillbox native (default: 1G memory, 256 pids via cgroup)" "$sb -- /bin/true"

run "node -e 0" \
  -n "bare" "node -e 0" \
  -n "bwrap" "$bwrap_cmd /usr/bin/node -e 0" \
  -n "skillbox native (no cgroup limits)" "$sb --memory none --pids none -- node -e 0" \
  -n "skillbox native (default limits)" "$sb -- node -e 0"

# The wasm backend: CPython and QuickJS for WASI (the guests scripts/test.sh installs in
# target/wasm-home, compiled once, so the module cache is warm), beside the same
# one-liners bare and on native. Skipped with a note when the guests are missing.
if "$skillbox" --data-dir "$data" exec --backend wasm -- python3 -c pass >/dev/null 2>&1 \
   && "$skillbox" --data-dir "$data" exec --backend wasm -- node -e 0 >/dev/null 2>&1; then
  run "python3 -c pass, and a JS one-liner" \
    -n "bare python3" "python3 -c pass" \
    -n "skillbox native python3" "$sb -- python3 -c pass" \
    -n "skillbox wasm python3 (CPython 3.12 for WASI)" "$sb --backend wasm -- python3 -c pass" \
    -n "bare node" "node -e 0" \
    -n "skillbox wasm node (QuickJS-NG for WASI)" "$sb --backend wasm -- node -e 0"
else
  echo "(wasm rows skipped: no wasm guests in $SKILLBOX_WASM_HOME; \`skillbox setup\` installs them)" >> "$out"
  echo >> "$out"
fi

# Container backends: sandbox create -> `node -e 0` -> remove, against the same through
# `docker run --rm` (the usual Docker script) on the same image. Needs dockerd and the
# image (`skillbox image build`); skipped with a note otherwise.
container_runs=${CONTAINER_RUNS:-40}
image=$(runtime_image "$skillbox" "$data")
if [ -n "$image" ]; then
  dr="docker run --rm --network none --read-only --cap-drop ALL --security-opt no-new-privileges --user 65532:65532"
  gvisor_rows=()
  if "$skillbox" --data-dir "$data" doctor --json | python3 -c '
import json, sys
sys.exit(0 if any(b["name"] == "gvisor" and b["available"] for b in json.load(sys.stdin)["backends"]) else 1)'; then
    gvisor_rows=(-n "docker run --runtime=runsc" "$dr --runtime=runsc $image node -e 0"
                 -n "skillbox gvisor" "$sb --backend gvisor -- node -e 0")
  fi
  runs=$container_runs run "node -e 0 in a container (create, run, remove)" \
    -n "skillbox native" "$sb -- node -e 0" \
    -n "docker run (runc)" "$dr $image node -e 0" \
    -n "skillbox docker" "$sb --backend docker -- node -e 0" \
    "${gvisor_rows[@]}"
else
  echo "(container rows skipped: no Docker daemon or no runtime image; see \`skillbox doctor\`)" >> "$out"
fi

# hyperfine's -n names replace the command in the export; put the commands below.
{
  echo "Commands: bwrap = \`${bwrap_cmd//$ws/WS} CMD\`; skillbox = the static-pie release binary (\`scripts/dist.sh\`; \"dynamic build\" is \`cargo build --release\`) running \`skillbox exec [--memory none --pids none] [--backend docker|gvisor|wasm] -- CMD\`; docker run = \`docker run --rm --network none --read-only --cap-drop ALL --security-opt no-new-privileges --user 65532:65532 [--runtime=runsc] IMAGE node -e 0\`."
} >> "$out"
cat "$out"
