#!/usr/bin/env bash
# What a capability's volumes cost a run, side by side in one run: `skillbox cap run`
# of a native oneshot capability whose entry does nothing (`:` in sh), with no volume,
# a read-only volume, a read-write volume its sandbox's host user owns (a plain bind),
# and a read-write volume another user owns (idmapped to the sandbox for every exec); beside
# the same entry run bare (`sh t.sh`). Two passes with hyperfine, the second reversed;
# a clean environment, the release binary (scripts/dist.sh), medians. Run as root (the
# idmapped row needs it).
#
#   bench/volumes.sh                  # writes bench/results/volumes.md and prints it
#   RUNS=60 bench/volumes.sh
#   SKILLBOX_BENCH_BIN=/path/skillbox bench/volumes.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${BENCH_CLEAN_ENV:-}" ]; then
  exec env -i BENCH_CLEAN_ENV=1 PATH="$PATH" HOME="$HOME" RUNS="${RUNS:-}" \
    SKILLBOX_BENCH_DATA="${SKILLBOX_BENCH_DATA:-}" SKILLBOX_BENCH_BIN="${SKILLBOX_BENCH_BIN:-}" "$0" "$@"
fi
runs=${RUNS:-40}
runs=${runs:-40}
command -v hyperfine >/dev/null || { echo "bench/volumes.sh: hyperfine is missing" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "bench/volumes.sh: run it as root (the idmapped row needs it)" >&2; exit 1; }
skillbox=${SKILLBOX_BENCH_BIN:-$(scripts/dist.sh)}
data=${SKILLBOX_BENCH_DATA:-$PWD/target/bench-data}
mkdir -p "$data"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
project=$work/project
mkdir -p "$work/shared" "$work/nobodys" "$work/users"
chown 65534:65534 "$work/nobodys"
chown 4242:4242 "$work/users"
echo ':' > "$work/t.sh"
names=(none ro rw-plain rw-idmapped)
volumes=(
  ""
  "volumes:\n  - host: $work/shared\n    sandbox: /data\n"
  "volumes:\n  - host: $work/nobodys\n    sandbox: /data\n    rw: true\n"
  "volumes:\n  - host: $work/users\n    sandbox: /data\n    rw: true\n"
)
cap() { "$skillbox" --data-dir "$data" cap --project "$project" "$@"; }
for i in "${!names[@]}"; do
  dir=$project/capabilities/vol-${names[$i]}
  mkdir -p "$dir"
  cp "$work/t.sh" "$dir/t.sh"
  printf "name: vol-%s\ndescription: does nothing\nversion: 0.1.0\nenvironment: native\nlifecycle: oneshot\nentry: t.sh\n${volumes[$i]}" \
    "${names[$i]}" > "$dir/manifest.yaml"
  cap grant "vol-${names[$i]}" >/dev/null 2>&1
  cap run "vol-${names[$i]}" >/dev/null
done

all=(bare "${names[@]}")
command_of() {
  case $1 in
    bare) echo "sh $work/t.sh" ;;
    *) echo "$skillbox --data-dir $data cap --project $project run vol-$1" ;;
  esac
}
pass() {
  local json=$1; shift
  local args=()
  for name in "$@"; do args+=(-n "$name" "$(command_of "$name")"); done
  hyperfine -N -w 5 -r "$runs" --export-json "$json" "${args[@]}" >/dev/null
}
pass "$work/a.json" "${all[@]}"
reversed=()
for ((i = ${#all[@]} - 1; i >= 0; i--)); do reversed+=("${all[$i]}"); done
pass "$work/b.json" "${reversed[@]}"

mkdir -p bench/results
out=bench/results/volumes.md
python3 bench/two_passes.py "$work/a.json" "$work/b.json" "Capability volumes" \
  "\`skillbox cap run\` of a native oneshot capability whose entry does nothing, hyperfine, $runs runs a pass, two passes (the second reversed), medians." 2 \
  "bare=the entry bare (\`sh t.sh\`)" \
  "none=no volume" \
  "ro=a read-only volume" \
  "rw-plain=a read-write volume the sandbox's host user owns (a plain bind)" \
  "rw-idmapped=a read-write volume another user owns (idmapped for every exec)" > "$out"
cat "$out"
