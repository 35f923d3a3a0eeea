#!/usr/bin/env bash
# Sessions (POST /v1/sessions), side by side in one run:
#  - opening one (POST /v1/sessions to its 201) on native, and on docker from the
#    server's warm pool (`serve --warm-containers 2`) against docker with no pool;
#  - the round trip of a trivial exec (`true`: POST /v1/sessions/{id}/exec until its
#    exit event) in a native and a docker session, beside `docker exec` into an already
#    running container of the same image, and the Docker Engine API's exec (create,
#    start, inspect) on the same daemon, the floor under both.
# Paired rounds (every contender in each round, the order rotated), a clean environment,
# the release binary (scripts/dist.sh), medians. Between two opens the session is
# deleted and the warm pool left to fill again, untimed. Before each round the script
# waits (at most 20 minutes in all) while a rustc runs, and it records the load.
#
#   bench/sessions.sh                     # writes bench/results/sessions.md and prints it
#   ROUNDS=8 SAMPLES=15 bench/sessions.sh
#   SKILLBOX_BENCH_BIN=/path/skillbox bench/sessions.sh   # a release binary scripts/dist.sh
#                                         # built elsewhere (a clean checkout of a commit)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
if [ -z "${BENCH_CLEAN_ENV:-}" ]; then
  exec env -i BENCH_CLEAN_ENV=1 PATH="$PATH" HOME="$HOME" ROUNDS="${ROUNDS:-}" SAMPLES="${SAMPLES:-}" \
    SKILLBOX_BENCH_DATA="${SKILLBOX_BENCH_DATA:-}" SKILLBOX_BENCH_BIN="${SKILLBOX_BENCH_BIN:-}" "$0" "$@"
fi
rounds=${ROUNDS:-8}
rounds=${rounds:-8}
samples=${SAMPLES:-15}
samples=${samples:-15}
warm_size=2
for tool in curl python3 docker; do
  command -v "$tool" >/dev/null || { echo "bench/sessions.sh: $tool is missing" >&2; exit 1; }
done
skillbox=${SKILLBOX_BENCH_BIN:-$(scripts/dist.sh)}
data=${SKILLBOX_BENCH_DATA:-$PWD/target/bench-data}
mkdir -p "$data"
"$skillbox" --data-dir "$data" setup --no-wasm >/dev/null 2>&1
image=$(runtime_image "$skillbox" "$data")
if [ -z "$image" ]; then
  echo "bench/sessions.sh: no Docker daemon or no runtime image (skillbox image build); see skillbox doctor" >&2
  exit 1
fi

cold=$(free_port)
warm=$(free_port)
"$skillbox" --data-dir "$data" serve --addr "127.0.0.1:$cold" --warm-containers 0 2>/dev/null &
cold_pid=$!
"$skillbox" --data-dir "$data" serve --addr "127.0.0.1:$warm" --warm-containers "$warm_size" 2>/dev/null &
warm_pid=$!
# The container `docker exec` goes into: the same image, hardened as skillbox's.
container=$(docker run -d --rm --network none --read-only --cap-drop ALL --security-opt no-new-privileges \
  --user 65532:65532 "$image" sleep infinity)
trap 'kill $cold_pid $warm_pid 2>/dev/null; wait $cold_pid $warm_pid 2>/dev/null; docker rm -f "$container" >/dev/null 2>&1' EXIT
for port in $cold $warm; do
  for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break
    sleep 0.1
  done
done

mkdir -p bench/results
out=bench/results/sessions.md
python3 - "$cold" "$warm" "$cold_pid" "$warm_pid" "$warm_size" "$container" "$rounds" "$samples" "$skillbox" "$image" > "$out" <<'PY'
import http.client, json, os, socket, statistics, subprocess, sys, time

cold, warm, cold_pid, warm_pid, warm_size, container, rounds, samples, binary, image = sys.argv[1:]
warm_size, rounds, samples = int(warm_size), int(rounds), int(samples)
started_at = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def loadavg():
    return float(open("/proc/loadavg").read().split()[0])


def rustc_running():
    return subprocess.run(["pgrep", "-x", "rustc"], capture_output=True).returncode == 0


class Server:
    """One skillbox serve, over one kept-alive connection."""

    def __init__(self, port, pid):
        self.port, self.pid = port, pid
        self.conn = http.client.HTTPConnection("127.0.0.1", int(port), timeout=120)
        self.used = 0.0

    def ready(self):
        """A connected connection, untimed: the server closes one idle for 10 s."""
        if time.monotonic() - self.used > 5:
            self.conn.close()
            self.conn.connect()
        self.used = time.monotonic()

    def call(self, method, path, body=None):
        self.ready()
        headers = {"Content-Type": "application/json"} if body is not None else {}
        self.conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        response = self.conn.getresponse()
        data = response.read()
        self.used = time.monotonic()
        return response.status, data

    def open(self, backend):
        """Seconds from sending POST /v1/sessions to reading its 201, and the session."""
        self.ready()
        start = time.perf_counter()
        self.conn.request("POST", "/v1/sessions", body=json.dumps({"backend": backend}),
                          headers={"Content-Type": "application/json"})
        response = self.conn.getresponse()
        status, body = response.status, response.read()
        elapsed = time.perf_counter() - start
        self.used = time.monotonic()
        if status != 201:
            sys.exit(f"POST /v1/sessions {backend} on :{self.port}: {status} {body[:300]!r}")
        return elapsed, json.loads(body)

    def delete(self, session):
        status, body = self.call("DELETE", f"/v1/sessions/{session['id']}")
        if status != 200:
            sys.exit(f"DELETE {session['id']}: {status} {body[:300]!r}")

    def exec_true(self, session):
        """Seconds from sending the exec to reading its exit event."""
        self.ready()
        start = time.perf_counter()
        self.conn.request("POST", f"/v1/sessions/{session['id']}/exec", body=b'{"command":["true"]}',
                          headers={"Content-Type": "application/json"})
        response = self.conn.getresponse()
        exit_seen = False
        for line in response:
            if b'"type":"exit"' in line:
                exit_seen = json.loads(line)["exitCode"] == 0
                break
        elapsed = time.perf_counter() - start
        response.read()
        self.used = time.monotonic()
        if response.status != 200 or not exit_seen:
            sys.exit(f"exec true in {session['id']}: {response.status}, no exit 0")
        return elapsed

    def containers(self):
        """This server's running sandbox containers (its pool, and open sessions)."""
        listed = subprocess.run(
            ["docker", "ps", "--filter", "label=dev.skillbox.sandbox",
             "--format", '{{.Label "dev.skillbox.owner"}}'],
            capture_output=True, text=True, check=True).stdout.split()
        return sum(1 for owner in listed if owner.split("/")[1:2] == [self.pid])

    def settle(self, want):
        """Waits (at most 60 s) until this server runs exactly `want` containers."""
        deadline = time.monotonic() + 60
        while self.containers() != want:
            if time.monotonic() > deadline:
                sys.exit(f"server :{self.port}: its containers never settled at {want}")
            time.sleep(0.05)


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=60)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


def engine_exec():
    """Docker Engine API exec of `true`: create, start (attached, until it ends), inspect."""
    start = time.perf_counter()
    conn = UnixHTTPConnection("/var/run/docker.sock")
    conn.request("POST", f"/containers/{container}/exec",
                 body=json.dumps({"Cmd": ["true"], "AttachStdout": True, "AttachStderr": True}),
                 headers={"Content-Type": "application/json"})
    exec_id = json.loads(conn.getresponse().read())["Id"]
    conn.request("POST", f"/exec/{exec_id}/start", body=json.dumps({"Detach": False, "Tty": False}),
                 headers={"Content-Type": "application/json"})
    conn.getresponse().read()  # the raw stream, until the process ends
    conn.close()
    conn = UnixHTTPConnection("/var/run/docker.sock")
    conn.request("GET", f"/exec/{exec_id}/json")
    code = json.loads(conn.getresponse().read())["ExitCode"]
    conn.close()
    elapsed = time.perf_counter() - start
    if code != 0:
        sys.exit(f"engine exec: exit {code}")
    return elapsed


def timed_process(argv):
    start = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{argv}: exit {done.returncode}: {done.stderr[:300]!r}")
    return elapsed


def curl_exec(server, session):
    return timed_process(["curl", "-sSfN", "-o", "/dev/null", "-X", "POST", "-H", "content-type: application/json",
                          "-d", '{"command":["true"]}',
                          f"http://127.0.0.1:{server.port}/v1/sessions/{session['id']}/exec"])


cold_server, warm_server = Server(cold, cold_pid), Server(warm, warm_pid)
opened_ms = {}


def open_on(server, backend, label, settle_to):
    def measure():
        server.settle(settle_to)
        elapsed, session = server.open(backend)
        opened_ms.setdefault(label, []).append(session["openMs"])
        server.delete(session)
        return elapsed
    return measure


# Sessions kept open for the exec round trips.
native_session = cold_server.open("native")[1]
docker_session = warm_server.open("docker")[1]

create = {
    "native": open_on(cold_server, "native", "native", 0),
    # The warm server also runs the docker session the exec round trips use.
    f"docker, warm pool (`--warm-containers {warm_size}`)": open_on(warm_server, "docker", "warm", warm_size + 1),
    "docker, no pool (`--warm-containers 0`)": open_on(cold_server, "docker", "cold", 0),
}
# The warm server's pool fills for a backend once it is used.
warm_server.delete(warm_server.open("docker")[1])

execs = {
    "skillbox native session (HTTP, kept-alive connection)": lambda: cold_server.exec_true(native_session),
    "skillbox docker session (HTTP, kept-alive connection)": lambda: warm_server.exec_true(docker_session),
    "skillbox native session (`curl`, a process and a connection each)": lambda: curl_exec(cold_server, native_session),
    "skillbox docker session (`curl`, a process and a connection each)": lambda: curl_exec(warm_server, docker_session),
    "`docker exec CONTAINER true` (the CLI)": lambda: timed_process(["docker", "exec", container, "true"]),
    "Docker Engine API exec (create, start, inspect; no CLI)": engine_exec,
}

times = {name: [] for name in (*create, *execs)}
load = []
waited = 0.0
print(f"warming up ({time.strftime('%H:%M:%S')})", file=sys.stderr)
for name, measure in (*create.items(), *execs.items()):
    for _ in range(3):  # warm-up, not kept
        measure()
opened_ms.clear()
for round_no in range(rounds):
    while rustc_running() and waited < 1200:
        time.sleep(5)
        waited += 5
    load.append((loadavg(), rustc_running()))
    print(f"round {round_no + 1} of {rounds} ({time.strftime('%H:%M:%S')}, load {load[-1][0]:.2f})", file=sys.stderr)
    for group in (create, execs):
        names = list(group)
        shift = round_no % len(names)
        for name in names[shift:] + names[:shift]:
            for _ in range(samples):
                times[name].append(group[name]())
load.append((loadavg(), rustc_running()))
cold_server.delete(native_session)
warm_server.delete(docker_session)

docker_version = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"],
                                capture_output=True, text=True).stdout.strip()
mem = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)
print(f"Machine: {os.cpu_count()} cores, {mem} GiB, {os.uname().release}, Docker {docker_version}; "
      f"skillbox {binary} (release, static-pie); image {image}")
print(f"Date: {started_at}; {rounds} rounds × {samples} samples per contender, the order rotated each round; "
      f"clean environment")
print(f"Load average (1 min) at each round's start and at the end: "
      f"{', '.join(f'{l:.2f}' for l, _ in load)}; a rustc running then: "
      f"{sum(1 for _, r in load if r)} of {len(load)} times; waited {waited:.0f} s for builds to end")
print()


def table(title, group, extra=None):
    print(f"### {title}")
    print()
    head = "| contender | median | mean ± σ | min | max |" + (" server's openMs (median) |" if extra else "")
    print(head)
    print("|---|---:|---:|---:|---:|" + ("---:|" if extra else ""))
    for name in group:
        t = [s * 1000 for s in times[name]]
        row = (f"| {name} | {statistics.median(t):.1f} ms | {statistics.mean(t):.1f} ± {statistics.stdev(t):.1f} ms "
               f"| {min(t):.1f} ms | {max(t):.1f} ms |")
        if extra:
            row += f" {extra[name]} |"
        print(row)
    print()


labels = {name: key for name, key in zip(create, ("native", "warm", "cold"))}
table("Opening a session: POST /v1/sessions to its 201", create,
      {name: f"{statistics.median(opened_ms[labels[name]]):.0f} ms" for name in create})
table("Exec round trip of `true`: request sent to exit event read", execs)
PY
cat "$out"
