#!/usr/bin/env bash
# What rendering a deck's slide previews costs, side by side in one run: a cold
# `GET /v1/objects/{sha256}/slides` (the cached preview removed before each sample) of
# a 3-slide deck on two servers, A and B (by default the release binary, whose render
# runs in a native sandbox of its own, against SKILLBOX_BENCH_OLD if given), beside
# the same two programs run bare on the host with a fresh profile each time (`soffice
# --convert-to pdf`, then `pdftoppm -png -r 50`). Two passes with hyperfine, the second
# reversed; a clean environment, medians.
#
#   bench/previews.sh                 # writes bench/results/previews.md and prints it
#   RUNS=10 bench/previews.sh
#   SKILLBOX_BENCH_OLD=/path/older-skillbox bench/previews.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${BENCH_CLEAN_ENV:-}" ]; then
  exec env -i BENCH_CLEAN_ENV=1 PATH="$PATH" HOME="$HOME" RUNS="${RUNS:-}" \
    SKILLBOX_BENCH_BIN="${SKILLBOX_BENCH_BIN:-}" SKILLBOX_BENCH_OLD="${SKILLBOX_BENCH_OLD:-}" "$0" "$@"
fi
runs=${RUNS:-8}
for tool in hyperfine soffice pdftoppm curl; do
  command -v "$tool" >/dev/null || { echo "bench/previews.sh: $tool is missing" >&2; exit 1; }
done
. bench/lib.sh
new=${SKILLBOX_BENCH_BIN:-$(scripts/dist.sh)}
old=${SKILLBOX_BENCH_OLD:-}

work=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait "${pids[@]}" 2>/dev/null; rm -rf "$work"' EXIT
cat > "$work/deck.js" <<'JS'
const pptxgen = require("pptxgenjs");
const p = new pptxgen();
for (let i = 1; i <= 3; i++) {
  const s = p.addSlide();
  s.addText("Slide " + i, { x: 0.5, y: 0.5, w: 9, h: 1, fontSize: 36, bold: true });
  s.addText("A line of body text on slide " + i, { x: 0.5, y: 2, w: 9, h: 1, fontSize: 20 });
  s.addShape(p.ShapeType.rect, { x: 0.5, y: 3.5, w: 4, h: 1.5, fill: { color: "3366CC" } });
}
p.writeFile({ fileName: "deck.pptx" });
JS

# A server on a data dir of its own, with a deck made by a run in it: sets port and sha.
serve() {
  local bin=$1 name=$2
  port=$(free_port)
  mkdir -p "$work/$name"
  "$bin" --data-dir "$work/$name" serve --addr "127.0.0.1:$port" >/dev/null 2>&1 &
  pids+=($!)
  for _ in $(seq 300); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
  sha=$(python3 -c 'import json,sys; print(json.dumps({"script": open(sys.argv[1]).read(), "language": "node"}))' "$work/deck.js" |
    curl -sf "http://127.0.0.1:$port/v1/run" -H 'content-type: application/json' -d @- |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["files"][0]["sha256"])')
  # One render first: it must be PNGs, and LibreOffice's files are then in the page cache.
  curl -sf "http://127.0.0.1:$port/v1/objects/$sha/slides" | grep -q '"format":"png"' || {
    echo "bench/previews.sh: $name did not render PNGs:" >&2
    curl -s "http://127.0.0.1:$port/v1/objects/$sha/slides" >&2
    exit 1
  }
}

serve "$new" new
new_port=$port new_sha=$sha
names=(bare new)
commands=()
prepares=()
curl -sf "http://127.0.0.1:$new_port/v1/objects/$new_sha" -o "$work/deck.pptx"
bare="soffice -env:UserInstallation=file://$work/bare/profile --headless --invisible --nodefault --nolockcheck --nologo --norestore --convert-to pdf --outdir $work/bare $work/deck.pptx >/dev/null 2>&1 && pdftoppm -png -r 50 $work/bare/deck.pdf $work/bare/page"
commands+=("sh -c '$bare'")
prepares+=("rm -rf $work/bare && mkdir $work/bare")
commands+=("curl -sf http://127.0.0.1:$new_port/v1/objects/$new_sha/slides -o /dev/null")
prepares+=("rm -rf $work/new/previews/$new_sha")
if [ -n "$old" ]; then
  serve "$old" old
  old_port=$port old_sha=$sha
  names+=(old)
  commands+=("curl -sf http://127.0.0.1:$old_port/v1/objects/$old_sha/slides -o /dev/null")
  prepares+=("rm -rf $work/old/previews/$old_sha")
fi

pass() {
  local json=$1; shift
  local args=()
  for i in "$@"; do args+=(-n "${names[$i]}" --prepare "${prepares[$i]}" "${commands[$i]}"); done
  hyperfine -w 1 -r "$runs" --export-json "$json" "${args[@]}" >/dev/null
}
order=("${!names[@]}")
pass "$work/a.json" "${order[@]}"
reversed=()
for ((i = ${#order[@]} - 1; i >= 0; i--)); do reversed+=("${order[$i]}"); done
pass "$work/b.json" "${reversed[@]}"

mkdir -p bench/results
out=bench/results/previews.md
python3 bench/two_passes.py "$work/a.json" "$work/b.json" "Slide previews" \
  "A cold render of a 3-slide deck, hyperfine, $runs runs a pass, two passes (the second reversed), medians." 0 \
  "bare=\`soffice\` then \`pdftoppm\`, bare on the host" \
  "new=\`GET …/slides\`, the render in a native sandbox (A)" \
  "old=\`GET …/slides\`, SKILLBOX_BENCH_OLD's render (B)" > "$out"
cat "$out"
