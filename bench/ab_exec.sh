#!/usr/bin/env bash
# Two skillbox binaries side by side on the CLI's native exec rows of bench/all.sh:
# `exec -- /bin/true` and `exec -- node -e 0`, one-shot and through a `skillbox warm` of
# each binary's own, default limits, with bwrap and bare node as yardsticks, all in one
# hyperfine invocation per round, the order reversed every other round (A B A B). For a
# change's before and after.
#
#   bench/ab_exec.sh OLD_BINARY NEW_BINARY          # 4 rounds of 40 runs a command
#   ROUNDS=6 RUNS=60 bench/ab_exec.sh A B
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${BENCH_CLEAN_ENV:-}" ]; then
  exec env -i BENCH_CLEAN_ENV=1 PATH="$PATH" HOME="$HOME" ROUNDS="${ROUNDS:-}" RUNS="${RUNS:-}" \
    SKILLBOX_BENCH_DATA="${SKILLBOX_BENCH_DATA:-}" "$0" "$@"
fi
[ $# = 2 ] || { echo "usage: bench/ab_exec.sh BINARY_A BINARY_B" >&2; exit 2; }
data=${SKILLBOX_BENCH_DATA:-$PWD/target/bench-data}
mkdir -p "$data"
"$2" --data-dir "$data" setup --no-wasm >/dev/null 2>&1
exec python3 - "$1" "$2" "$data" "${ROUNDS:-4}" "${RUNS:-40}" <<'PY'
import os, shutil, statistics, sys
sys.path.insert(0, "bench")
from common import Warm, bwrap_yardstick, hyperfine

a, b, data, rounds, runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
bwrap, ws = bwrap_yardstick()
warm = {}
for name, binary in (("A", a), ("B", b)):
    warm[name] = os.path.join(data, f"warm-{name.lower()}")
    os.makedirs(warm[name], mode=0o700, exist_ok=True)
rows = []
for program, yardstick in (("/bin/true", ("bwrap --unshare-all", f"{bwrap} /bin/true")),
                           ("node -e 0", ("bare node -e 0", "node -e 0"))):
    commands = [yardstick]
    for name, binary in (("A", a), ("B", b)):
        commands.append((f"{name} one-shot {program}", f"{binary} --data-dir {data} exec -- {program}"))
        commands.append((f"{name} warm {program}", f"{binary} --data-dir {warm[name]} exec -- {program}"))
    with Warm(a, warm["A"]), Warm(b, warm["B"]):
        pooled = hyperfine(rounds, runs, commands)
    base = statistics.median(pooled[yardstick[0]])
    for kind in ("one-shot", "warm"):
        ma = statistics.median(pooled[f"A {kind} {program}"])
        mb = statistics.median(pooled[f"B {kind} {program}"])
        rows.append((f"`{program}`, {kind}", ma, mb, base, yardstick[0]))
print("| exec | A median | B median | B / A | A / yardstick | B / yardstick |")
print("|---|---:|---:|---:|---:|---:|")
for what, ma, mb, base, name in rows:
    print(f"| {what} | {ma*1000:.2f} ms | {mb*1000:.2f} ms | **{mb/ma:.3f}** | {ma/base:.2f} | {mb/base:.2f} ({name}) |")
shutil.rmtree(ws, ignore_errors=True)
PY
