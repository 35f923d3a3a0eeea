#!/usr/bin/env bash
# The server's memory under hostile load: 100 clients at once each send a 48 MiB body
# to POST /v1/run, then 100 clients at once each download a 128 MiB artifact. The
# server's peak RSS (VmHWM) must stay bounded (its body budget, streamed downloads), not
# grow with the load. Writes bench/results/server_rss.md.
#
#   bench/server_rss.sh
#   CLIENTS=50 bench/server_rss.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${BENCH_CLEAN_ENV:-}" ]; then
  exec env -i BENCH_CLEAN_ENV=1 PATH="$PATH" HOME="$HOME" CLIENTS="${CLIENTS:-}" "$0" "$@"
fi
clients=${CLIENTS:-100}
clients=${clients:-100}
command -v python3 >/dev/null || { echo "bench/server_rss.sh: python3 is missing" >&2; exit 1; }
skillbox=$(scripts/dist.sh)
data=${SKILLBOX_BENCH_DATA:-$PWD/target/bench-data}
mkdir -p "$data" bench/results
"$skillbox" --data-dir "$data" setup >/dev/null 2>&1
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$skillbox" --data-dir "$data" serve --addr "127.0.0.1:$port" --max-connections 4096 2>/dev/null &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null' EXIT
python3 - "$pid" "$port" "$clients" <<'PY'
import http.client, json, sys, threading, time

pid, port, clients = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
MIB = 1 << 20

def status(field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0

for _ in range(200):
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("GET", "/healthz"); c.getresponse().read(); break
    except OSError:
        time.sleep(0.1)

def rss_during(work):
    """Runs `work` in `clients` threads at once; samples VmRSS while they run."""
    peak, stop = [status("VmRSS")], threading.Event()
    def sample():
        while not stop.is_set():
            peak.append(status("VmRSS")); time.sleep(0.02)
    sampler = threading.Thread(target=sample); sampler.start()
    outcomes, lock = {}, threading.Lock()
    def one(i):
        try:
            key = work(i)
        except Exception as e:
            key = type(e).__name__
        with lock:
            outcomes[key] = outcomes.get(key, 0) + 1
    threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
    started = time.monotonic()
    for t in threads: t.start()
    for t in threads: t.join()
    stop.set(); sampler.join()
    return max(peak), time.monotonic() - started, outcomes

# A 48 MiB body: a valid request, its script padded with a comment.
body = json.dumps({"script": "true #" + "x" * (48 * MIB - 64), "language": "sh"}).encode()
def upload(_):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    c.putrequest("POST", "/v1/run"); c.putheader("Content-Type", "application/json")
    c.putheader("Content-Length", str(len(body))); c.endheaders()
    try:
        view = memoryview(body)
        for at in range(0, len(view), MIB):
            c.send(view[at:at + MIB])
    except (BrokenPipeError, ConnectionResetError):
        pass  # refused before the body was read: the point
    r = c.getresponse(); r.read()
    return r.status

base_rss = status("VmRSS")
up_peak, up_secs, up_outcomes = rss_during(upload)

# One 128 MiB artifact to download.
script = "head -c 134217728 /dev/urandom > big.bin"
c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
c.request("POST", "/v1/run", json.dumps({"script": script, "language": "sh"}), {"Content-Type": "application/json"})
made = json.loads(c.getresponse().read())
url = made["files"][0]["url"]
def download(_):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    c.request("GET", url); r = c.getresponse()
    got = 0
    while True:
        chunk = r.read(MIB)
        if not chunk: break
        got += len(chunk)
        time.sleep(0.001)  # a client slower than the disk
    return f"{r.status} {got // MIB} MiB"
down_peak, down_secs, down_outcomes = rss_during(download)

fmt = lambda b: f"{b / MIB:.0f} MiB"
lines = [
    "# Server RSS under hostile load (bench/server_rss.sh)",
    "",
    f"{clients} clients at once; `skillbox serve` (release binary) with its defaults (256 MiB body budget).",
    "",
    "| load | server RSS before | peak RSS | what the clients got | wall time |",
    "|---|---:|---:|---|---:|",
    f"| {clients} × 48 MiB POST /v1/run bodies ({fmt(clients * 48 * MIB)} offered) | {fmt(base_rss)} | {fmt(up_peak)} | {dict(sorted(up_outcomes.items()))} | {up_secs:.1f} s |",
    f"| {clients} × 128 MiB downloads ({fmt(clients * 128 * MIB)} served) | {fmt(status('VmRSS'))} | {fmt(down_peak)} | {dict(sorted(down_outcomes.items()))} | {down_secs:.1f} s |",
    "",
    f"VmHWM (the process's peak over the whole run): {fmt(status('VmHWM'))}.",
]
text = "\n".join(lines) + "\n"
open("bench/results/server_rss.md", "w").write(text)
print(text)
PY
