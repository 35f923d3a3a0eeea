#!/usr/bin/env bash
# Two skillbox binaries side by side on a native session's exec round trip: `true` in
# an open session (POST /v1/sessions/{id}/exec until its exit event), one session per
# server, PAIRS pairs in alternating order, a pause between execs as an agent's think
# time gives (PAUSE_MS). For a change's before and after.
#
#   bench/ab_session_exec.sh OLD_BINARY NEW_BINARY          # 60 pairs, 50 ms apart
#   PAIRS=100 PAUSE_MS=200 bench/ab_session_exec.sh A B
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
if [ -z "${BENCH_CLEAN_ENV:-}" ]; then
  exec env -i BENCH_CLEAN_ENV=1 PATH="$PATH" HOME="$HOME" PAIRS="${PAIRS:-}" \
    PAUSE_MS="${PAUSE_MS:-}" "$0" "$@"
fi
[ $# = 2 ] || { echo "usage: bench/ab_session_exec.sh BINARY_A BINARY_B" >&2; exit 2; }
a=$1 b=$2
da=$(mktemp -d) db=$(mktemp -d)
pa=$(free_port); pb=$(free_port)
"$a" --data-dir "$da" serve --addr "127.0.0.1:$pa" 2>/dev/null & apid=$!
"$b" --data-dir "$db" serve --addr "127.0.0.1:$pb" 2>/dev/null & bpid=$!
trap 'kill $apid $bpid 2>/dev/null; wait $apid $bpid 2>/dev/null; rm -rf "$da" "$db"' EXIT
for port in $pa $pb; do
  for _ in $(seq 300); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
done
python3 - "$pa" "$pb" "$a" "$b" "${PAIRS:-60}" "${PAUSE_MS:-50}" <<'PY'
import http.client, json, statistics, sys, time
pa, pb, a, b, pairs, pause = sys.argv[1:]
pairs, pause = int(pairs), float(pause) / 1000


def open_session(port):
    conn = http.client.HTTPConnection("127.0.0.1", int(port), timeout=60)
    conn.request("POST", "/v1/sessions", body=json.dumps({"backend": "native"}),
                 headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    body = json.loads(response.read())
    if response.status != 201:
        raise SystemExit(f"POST /v1/sessions: {response.status} {body}")
    return conn, body["id"]


def exec_true(conn, session):
    start = time.perf_counter()
    conn.request("POST", f"/v1/sessions/{session}/exec", body=json.dumps({"command": ["true"]}),
                 headers={"Content-Type": "application/json"})
    lines = conn.getresponse().read().decode().splitlines()
    took = time.perf_counter() - start
    if json.loads(lines[-1]).get("type") != "exit":
        raise SystemExit(f"exec: {lines}")
    return took


sessions = [open_session(pa), open_session(pb)]
times = [[], []]
for i in range(pairs):
    for k in ((0, 1) if i % 2 == 0 else (1, 0)):
        time.sleep(pause)
        times[k].append(exec_true(*sessions[k]))
print(f"native session exec of `true`, {pairs} pairs, {pause * 1000:.0f} ms apart; median (min)")
for name, samples in ((f"A {a}", times[0]), (f"B {b}", times[1])):
    print(f"  {statistics.median(samples) * 1000:6.2f} ms ({min(samples) * 1000:.2f})  {name}")
print(f"  B / A: {statistics.median(times[1]) / statistics.median(times[0]):.2f}")
PY
