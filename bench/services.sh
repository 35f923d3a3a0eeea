#!/usr/bin/env bash
# A persistent capability's connections, side by side in one run: one HTTP request
# (`curl --unix-socket … /healthz`, a new connection each) to the http-notes example
# started on native, docker and gvisor (`skillbox cap start`), beside the same server
# run bare on the host (curl over TCP), and `docker exec CONTAINER true` into a running
# container of the runtime image on runc and on runsc: each container connection is one
# relay started by such an exec, so that is its floor.
# Two passes with hyperfine, the second in reverse order; a clean environment, the
# release binary (scripts/dist.sh), medians.
#
#   bench/services.sh                 # writes bench/results/services.md and prints it
#   RUNS=40 bench/services.sh
#   SKILLBOX_BENCH_BIN=/path/skillbox bench/services.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
if [ -z "${BENCH_CLEAN_ENV:-}" ]; then
  exec env -i BENCH_CLEAN_ENV=1 PATH="$PATH" HOME="$HOME" RUNS="${RUNS:-}" \
    SKILLBOX_BENCH_DATA="${SKILLBOX_BENCH_DATA:-}" SKILLBOX_BENCH_BIN="${SKILLBOX_BENCH_BIN:-}" "$0" "$@"
fi
runs=${RUNS:-30}
runs=${runs:-30}
for tool in curl python3 docker hyperfine; do
  command -v "$tool" >/dev/null || { echo "bench/services.sh: $tool is missing" >&2; exit 1; }
done
skillbox=${SKILLBOX_BENCH_BIN:-$(scripts/dist.sh)}
data=${SKILLBOX_BENCH_DATA:-$PWD/target/bench-data}
mkdir -p "$data"
"$skillbox" --data-dir "$data" setup --no-wasm >/dev/null 2>&1
image=$(runtime_image "$skillbox" "$data")
if [ -z "$image" ]; then
  echo "bench/services.sh: no Docker daemon or no runtime image (skillbox image build); see skillbox doctor" >&2
  exit 1
fi

work=$(mktemp -d)
project=$work/project
mkdir -p "$project/capabilities"
for backend in native docker gvisor; do
  dir=$project/capabilities/notes-$backend
  mkdir -p "$dir"
  cp examples/capabilities/http-notes/server.py "$dir/"
  sed -e "s/^name: http-notes/name: notes-$backend/" -e "s/^environment: native/environment: $backend/" \
    examples/capabilities/http-notes/manifest.yaml > "$dir/manifest.yaml"
done
cap() { "$skillbox" --data-dir "$data" cap --project "$project" "$@"; }
port=$(free_port)
sed "s/8080/$port/g" examples/capabilities/http-notes/server.py > "$work/server.py"
python3 "$work/server.py" 2>/dev/null &
bare_pid=$!
runc=$(docker run -d --rm --network none --read-only --cap-drop ALL --security-opt no-new-privileges \
  --user 65532:65532 "$image" sleep infinity)
runsc=$(docker run -d --rm --runtime runsc --network none --read-only --cap-drop ALL \
  --security-opt no-new-privileges --user 65532:65532 "$image" sleep infinity)
cleanup() {
  for backend in native docker gvisor; do cap stop "notes-$backend" >/dev/null 2>&1 || true; done
  kill "$bare_pid" 2>/dev/null || true
  docker rm -f "$runc" "$runsc" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
declare -A socket
for backend in native docker gvisor; do
  cap grant "notes-$backend" >/dev/null
  socket[$backend]=$(cap start "notes-$backend" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["endpoint"].removeprefix("unix:"))')
done
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.05; done

names=(bare native docker gvisor "exec-runc" "exec-runsc")
commands=(
  "curl -sf http://127.0.0.1:$port/healthz"
  "curl -sf --unix-socket ${socket[native]} http://x/healthz"
  "curl -sf --unix-socket ${socket[docker]} http://x/healthz"
  "curl -sf --unix-socket ${socket[gvisor]} http://x/healthz"
  "docker exec $runc true"
  "docker exec $runsc true"
)
pass() {
  local json=$1; shift
  local args=()
  for i in "$@"; do args+=(-n "${names[$i]}" "${commands[$i]}"); done
  hyperfine -N -w 3 -r "$runs" --export-json "$json" "${args[@]}" >/dev/null
}
pass "$work/a.json" 0 1 2 3 4 5
pass "$work/b.json" 5 4 3 2 1 0

mkdir -p bench/results
out=bench/results/services.md
python3 bench/two_passes.py "$work/a.json" "$work/b.json" "Persistent capability connections" \
  "One HTTP request on a new connection (\`curl … /healthz\`), hyperfine, $runs runs a pass, two passes (the second reversed), medians." 1 \
  "bare=the server bare on the host (TCP)" \
  "native=native, through its forwarded socket" \
  "docker=docker, through its forwarded socket (a relay per connection)" \
  "gvisor=gvisor, through its forwarded socket (a relay per connection)" \
  "exec-runc=\`docker exec C true\` (runc): a relay's floor" \
  "exec-runsc=\`docker exec C true\` (runsc): a relay's floor" > "$out"
cat "$out"
