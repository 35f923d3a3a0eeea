#!/usr/bin/env bash
# Skills projection: a workspace of 10,000 files / 200 MB under skills/ projected into a
# sandbox's kept /workspace (a --workdir), then projected again unchanged, on each
# backend, A B A B. The projection's own cost is what `skills project --json` reports
# (planning: walking and hashing, with the stat cache; placing: one put_tree, or only
# reading the fingerprint when it is equal); the whole command, sandbox set-up
# included, is timed from outside too.
#
#   bench/projection.sh                       # writes bench/results/projection.md
#   ROUNDS=7 BACKENDS="native docker gvisor" bench/projection.sh
#   BOX_PARENT=/var/tmp bench/projection.sh   # the kept /workspace on disk, not tmpfs
#
# The kept /workspace is on tmpfs (/dev/shm) by default, as a sandbox's own workspace
# is: on this VM's ext4 disk, a full projection right after the previous one's tree was
# removed waits on writing back that 200 MB, which measures the disk, not skillbox.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${BENCH_CLEAN_ENV:-}" ]; then
  exec env -i BENCH_CLEAN_ENV=1 PATH="$PATH" HOME="$HOME" ROUNDS="${ROUNDS:-}" \
    BACKENDS="${BACKENDS:-}" FILES="${FILES:-}" FILE_KB="${FILE_KB:-}" BOX_PARENT="${BOX_PARENT:-}" "$0" "$@"
fi
rounds=${ROUNDS:-5}
rounds=${rounds:-5}
backends=${BACKENDS:-native docker}
backends=${backends:-native docker}
files=${FILES:-10000}
files=${files:-10000}
file_kb=${FILE_KB:-20}
file_kb=${file_kb:-20}

skillbox=$(scripts/dist.sh)
data=$(mktemp -d)
ws=$(mktemp -d)
box_parent=${BOX_PARENT:-/dev/shm}
box_parent=${box_parent:-/dev/shm}
box=$(mktemp -d -p "$box_parent")
samples=$(mktemp)
trap 'rm -rf "$data" "$ws" "$box" "$samples"' EXIT

# 100 skills of files/100 files each, random bytes (nothing compresses or dedups).
python3 - "$ws" "$files" "$file_kb" <<'PY'
import os, sys
ws, files, kb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
skills = 100
for s in range(skills):
    d = os.path.join(ws, "skills", f"s{s:03}")
    os.makedirs(os.path.join(d, "data"), exist_ok=True)
    with open(os.path.join(d, "SKILL.md"), "w") as f:
        f.write(f"---\nname: s{s:03}\ndescription: benchmark skill {s}\n---\n")
    for i in range(files // skills - 1):
        with open(os.path.join(d, "data", f"f{i:04}.bin"), "wb") as f:
            f.write(os.urandom(kb * 1024))
PY
total=$(du -sb "$ws/skills" | cut -f1)
count=$(find "$ws/skills" -type f | wc -l)

fresh_box() {
  rm -rf "$box"
  mkdir "$box"
  # As root the sandbox runs as the workdir's owner: never root.
  [ "$(id -u)" = 0 ] && chown 65534:65534 "$box"
  return 0
}

# One projection: the command's own report plus the wall time around it.
project() {
  local backend=$1 label=$2
  local start end report
  start=$(date +%s%N)
  report=$("$skillbox" --data-dir "$data" skills --workspace "$ws" project --workdir "$box" \
    --backend "$backend" --no-user-skills --json)
  end=$(date +%s%N)
  python3 - "$backend" "$label" "$(( (end - start) / 1000000 ))" "$report" >> "$samples" <<'PY'
import json, sys
backend, label, wall, report = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
want = label != "unchanged"
if report["copied"] != want:
    sys.exit(f"{backend} {label}: copied={report['copied']}, expected {want}")
print(json.dumps({"backend": backend, "label": label, "wall": wall,
                  "projection": report["totalMillis"], "plan": report["planMillis"],
                  "apply": report["applyMillis"], "files": report["files"], "bytes": report["bytes"]}))
PY
}

for backend in $backends; do
  # A cold stat cache: every file read and hashed once.
  rm -f "$data/skills/hash-cache.json"
  fresh_box
  project "$backend" cold
  project "$backend" unchanged
  for _ in $(seq "$rounds"); do
    fresh_box
    project "$backend" full
    project "$backend" unchanged
  done
done

mkdir -p bench/results
out=bench/results/projection.md
python3 - "$samples" "$count" "$total" "$rounds" "$box_parent" > "$out" <<'PY'
import json, statistics, sys, subprocess, os
samples = [json.loads(l) for l in open(sys.argv[1])]
count, total, rounds, box = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
cores = os.cpu_count()
print(f"Machine: {cores} cores, {subprocess.run(['uname','-sr'],capture_output=True,text=True).stdout.strip()}; "
      f"{count} files, {total/1e6:.0f} MB; the kept /workspace under {box}; medians of {rounds} rounds, full and unchanged alternating")
print()
print("| backend | case | projection (plan + place) | plan | place | whole command |")
print("|---|---|---:|---:|---:|---:|")
for backend in dict.fromkeys(s["backend"] for s in samples):
    rows = {}
    for label in ("cold", "full", "unchanged"):
        picked = [s for s in samples if s["backend"] == backend and s["label"] == label]
        if not picked:
            continue
        med = lambda k: statistics.median(s[k] for s in picked)
        rows[label] = med("projection")
        print(f"| {backend} | {label} | {med('projection'):.0f} ms | {med('plan'):.0f} ms | {med('apply'):.0f} ms | {med('wall'):.0f} ms |")
    if rows.get("full"):
        ratio = rows["unchanged"] / rows["full"]
        print(f"| {backend} | unchanged / full | {ratio*100:.1f} % | | | |")
PY
cat "$out"
