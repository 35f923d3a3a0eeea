"""The body of bench/all.sh: measures every row of issue 16's table side by side with
its yardstick and writes bench/results/all.md. Run it through bench/all.sh (which
builds the release binary and cleans the environment)."""

import http.client
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import time

from common import Warm, bwrap_yardstick, hyperfine, rate

SKILLBOX, DATA = sys.argv[1], sys.argv[2]
QUICK = bool(os.environ.get("QUICK"))
OUT = "bench/results/all.md"


def log(text):
    print(f"bench/all.sh: {text}", file=sys.stderr, flush=True)


def ms(seconds):
    return f"{seconds * 1000:.1f} ms"


def table(title, pooled):
    lines = [f"### {title}", "", "| command | median | mean ± σ | min | max | n |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, times in pooled.items():
        lines.append(f"| {name} | {ms(statistics.median(times))} | {ms(statistics.mean(times))} ± "
                     f"{ms(statistics.stdev(times))} | {ms(min(times))} | {ms(max(times))} | {len(times)} |")
    return "\n".join(lines) + "\n"


def doctor():
    out = subprocess.run([SKILLBOX, "--data-dir", DATA, "doctor", "--json"],
                         capture_output=True, text=True, check=False).stdout
    return {b["name"]: b for b in json.loads(out)["backends"]}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A `skillbox serve` on a free loopback port, stopped on exit."""

    def __init__(self, *flags):
        self.port = free_port()
        self.process = subprocess.Popen(
            [SKILLBOX, "--data-dir", DATA, "serve", "--addr", f"127.0.0.1:{self.port}", *flags],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(300):
            try:
                self.get("/healthz")
                return
            except OSError:
                time.sleep(0.1)
        raise SystemExit("bench/all.sh: skillbox serve did not answer")

    def get(self, path):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        conn.request("GET", path)
        return conn.getresponse().read()

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.process.terminate()
        self.process.wait(timeout=120)


def post_run(conn, backend):
    body = json.dumps({"script": "0", "language": "node", "backend": backend})
    start = time.perf_counter()
    conn.request("POST", "/v1/run", body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    payload = response.read()
    took = time.perf_counter() - start
    if response.status != 200 or json.loads(payload).get("exitCode") != 0:
        raise SystemExit(f"bench/all.sh: POST /v1/run on {backend}: {response.status} {payload[:300]!r}")
    return took


def main():
    os.makedirs("bench/results", exist_ok=True)
    backends = doctor()
    cgroup = backends["native"]["layers"].get("cgroup", {}).get("detail", "?")
    machine = (f"{os.cpu_count()} cores, {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, "
               f"Linux {platform.release()}, cgroup: {cgroup}, user: {os.getenv('USER') or os.getuid()}")
    sections = []
    bars = []
    bwrap, ws = bwrap_yardstick()
    sb = f"{SKILLBOX} --data-dir {DATA} exec"
    rounds, runs = (2, 10) if QUICK else (4, 50)

    # 1. Native /bin/true against bwrap, skillbox with its default limits: one-shot
    # (the CLI makes its sandbox) and through `skillbox warm` (a sandbox made ahead).
    warm_data = os.path.join(DATA, "warm")
    os.makedirs(warm_data, mode=0o700, exist_ok=True)
    sbw = f"{SKILLBOX} --data-dir {warm_data} exec"
    log("native /bin/true against bwrap")
    with Warm(SKILLBOX, warm_data):
        pooled = hyperfine(rounds, runs, [
            ("bwrap --unshare-all", f"{bwrap} /bin/true"),
            ("skillbox native, default limits, with skillbox warm", f"{sbw} -- /bin/true"),
            ("skillbox native, default limits, one-shot", f"{sb} -- /bin/true"),
            ("skillbox native, --memory none --pids none, one-shot", f"{sb} --memory none --pids none -- /bin/true"),
        ])
    sections.append(table("`/bin/true`", pooled))
    bwrap_median = statistics.median(pooled["bwrap --unshare-all"])
    ratio = statistics.median(pooled["skillbox native, default limits, with skillbox warm"]) / bwrap_median
    bars.append(("native `exec -- /bin/true` (default limits, `skillbox warm`) / bwrap", ratio, "≤ 0.80", ratio <= 0.80))
    cold = statistics.median(pooled["skillbox native, default limits, one-shot"]) / bwrap_median
    bars.append(("(the same, one-shot: no `skillbox warm`) / bwrap", cold, "(no bar)", None))

    # 1b. The same one-shot, sporadic: 300 ms of quiet before each sample, as a CLI is
    # used (back to back, the kernel's state for cgroup moves and namespace teardown
    # stays warm from the run before). No bar: this says what one `skillbox exec` costs.
    log("native /bin/true against bwrap, sporadic (300 ms apart)")
    pooled = hyperfine(2, 10 if QUICK else 30, [
        ("bwrap --unshare-all, sporadic", f"{bwrap} /bin/true"),
        ("skillbox native, default limits, one-shot, sporadic", f"{sb} -- /bin/true"),
        ("skillbox native, --memory none --pids none, one-shot, sporadic",
         f"{sb} --memory none --pids none -- /bin/true"),
    ], prepare="sleep 0.3")
    sections.append(table("`/bin/true`, sporadic (300 ms of quiet before each)", pooled))
    sporadic = (statistics.median(pooled["skillbox native, default limits, one-shot, sporadic"])
                / statistics.median(pooled["bwrap --unshare-all, sporadic"]))
    bars.append(("(one-shot, sporadic) / bwrap, sporadic", sporadic, "(no bar)", None))

    # 2. Native node -e 0 against bare node.
    log("native node -e 0 against bare node")
    with Warm(SKILLBOX, warm_data):
        pooled = hyperfine(rounds, max(runs // 2, 10), [
            ("bare node -e 0", "node -e 0"),
            ("skillbox native node -e 0, default limits, with skillbox warm", f"{sbw} -- node -e 0"),
            ("skillbox native node -e 0, default limits, one-shot", f"{sb} -- node -e 0"),
        ])
    sections.append(table("`node -e 0`", pooled))
    bare = statistics.median(pooled["bare node -e 0"])
    ratio = statistics.median(pooled["skillbox native node -e 0, default limits, with skillbox warm"]) / bare
    bars.append(("native `exec -- node -e 0` (`skillbox warm`) / bare node", ratio, "≤ 1.15", ratio <= 1.15))
    cold = statistics.median(pooled["skillbox native node -e 0, default limits, one-shot"]) / bare
    bars.append(("(the same, one-shot: no `skillbox warm`) / bare node", cold, "(no bar)", None))

    # 3. POST /v1/run throughput against bare spawns, paired per concurrency.
    log("POST /v1/run against bare spawns (c = 1, 2, 8)")
    seconds = 4 if QUICK else 10
    lines = ["### `POST /v1/run` (`node`, script `0`) against bare `node -e 0` spawns", "",
             f"Server defaults; {seconds} s per point, each point run twice in the order A B B A.", "",
             "| concurrency | POST /v1/run req/s | bare spawns/s | ratio |", "|---:|---:|---:|---:|"]
    with Server() as server:
        def api(state):
            conn = state.get("conn") or http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
            state["conn"] = conn
            post_run(conn, "native")

        def bare(_state):
            subprocess.run(["node", "-e", "0"], check=True)

        api({})
        for c in (1, 2, 8):
            a1 = rate(api, c, seconds)
            b1 = rate(bare, c, seconds)
            b2 = rate(bare, c, seconds)
            a2 = rate(api, c, seconds)
            a, b = (a1 + a2) / 2, (b1 + b2) / 2
            lines.append(f"| {c} | {a:.1f} | {b:.1f} | {a / b:.0%} |")
            if c == 8:
                bars.append(("`POST /v1/run` at c=8 / bare spawns", a / b, "≥ 0.90", a / b >= 0.90))
        sections.append("\n".join(lines) + "\n")

        # 3b. The floor under that bar: at c = 8 both cores are busy, so every run's
        # kernel work for its namespaces counts against it. `unshare` makes the same
        # namespaces as a native sandbox and nothing else (no mount, cgroup, Landlock,
        # seccomp, HTTP or store); bwrap is the tool skillbox replaces. All four rotate.
        log("the floor at c = 8: namespaces alone (unshare) and bwrap, against bare spawns and the API")
        unshare = ["unshare", "--user", "--map-root-user", "--net", "--pid", "--mount", "--ipc", "--uts",
                   "--propagation", "unchanged", "--fork", "node", "-e", "0"]
        contenders = {
            "bare `node -e 0`": bare,
            "`unshare` (user, net, pid, mount, ipc, uts namespaces; nothing else) `node -e 0`":
                lambda _s: subprocess.run(unshare, check=True),
            "`bwrap --unshare-all` `node -e 0`":
                lambda _s: subprocess.run(f"{bwrap} node -e 0".split(), check=True),
            "skillbox `POST /v1/run`": api,
        }
        names = list(contenders)
        got = {name: [] for name in names}
        for r in range(2 if QUICK else 4):
            for name in names[r % 4:] + names[:r % 4]:
                got[name].append(rate(contenders[name], 8, seconds))
        floor = {name: statistics.median(got[name]) for name in names}
        base = floor[names[0]]
        lines = ["### The floor at c = 8: what a fresh set of namespaces costs", "",
                 f"Spawns (or runs) per second from 8 threads, {len(got[names[0]])} rounds of {seconds} s each, "
                 "the order rotated.", "",
                 "| what | per second | / bare |", "|---|---:|---:|"]
        for name in names:
            lines.append(f"| {name} | {floor[name]:.1f} | {floor[name] / base:.2f} |")
        sections.append("\n".join(lines) + "\n")
        bars.append(("(the floor: namespaces alone, `unshare`, at c=8) / bare spawns", floor[names[1]] / base,
                     "(no bar)", None))
        bars.append(("(`bwrap --unshare-all` at c=8) / bare spawns", floor[names[2]] / base, "(no bar)", None))

    # 4. Containers: one-shot exec and warm API runs against a cold docker run.
    docker = backends.get("docker", {})
    if not docker.get("available"):
        sections.append("(container rows skipped: no Docker daemon or no runtime image; see `skillbox doctor`)\n")
    else:
        image = docker["layers"]["image"]["detail"].split()[0]
        gvisor = backends.get("gvisor", {}).get("available", False)
        dr = ("docker run --rm --network none --read-only --cap-drop ALL "
              "--security-opt no-new-privileges --user 65532:65532")
        log("containers: skillbox exec against docker run")
        commands = [("docker run (runc)", f"{dr} {image} node -e 0"),
                    ("skillbox exec --backend docker", f"{sb} --backend docker -- node -e 0")]
        if gvisor:
            commands += [("docker run --runtime=runsc", f"{dr} --runtime=runsc {image} node -e 0"),
                         ("skillbox exec --backend gvisor", f"{sb} --backend gvisor -- node -e 0")]
        pooled = hyperfine(2, 5 if QUICK else 10, commands)
        sections.append(table("`node -e 0` in a container, one shot (create, run, remove)", pooled))

        log("containers: warm API runs against a cold docker run, paired")
        pairs = 6 if QUICK else 20
        lines = ["### A warm `POST /v1/run` (`node`, script `0`) against a cold `docker run` of `node -e 0`", "",
                 f"`skillbox serve --warm-containers 2`; {pairs} pairs a backend, each a request (1.5 s after the "
                 "last, so the pool has refilled) then a cold `docker run` of the same image, alternating.", "",
                 "| backend | warm API run | cold docker run | ratio |", "|---|---:|---:|---:|"]
        with Server("--warm-containers", "2") as server:
            for backend, runtime, bar in (("docker", [], 0.5), ("gvisor", ["--runtime=runsc"], 0.6)):
                if backend == "gvisor" and not gvisor:
                    lines.append("| gvisor | (skipped: runsc not registered) | | |")
                    continue
                conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
                post_run(conn, backend)  # the pool fills for this backend once used
                cold_cmd = dr.split() + runtime + [image, "node", "-e", "0"]
                warm, cold = [], []
                for i in range(pairs):
                    for step in (("api", "cold") if i % 2 == 0 else ("cold", "api")):
                        time.sleep(1.5)
                        if step == "api":
                            warm.append(post_run(conn, backend))
                        else:
                            start = time.perf_counter()
                            subprocess.run(cold_cmd, check=True, stdout=subprocess.DEVNULL)
                            cold.append(time.perf_counter() - start)
                w, c = statistics.median(warm), statistics.median(cold)
                lines.append(f"| {backend} | {ms(w)} | {ms(c)} | {w / c:.2f} |")
                bars.append((f"warm {backend} API run / cold `docker run{' --runtime=runsc' if runtime else ''}`",
                             w / c, f"≤ {bar}", w / c <= bar))
        sections.append("\n".join(lines) + "\n")
    shutil.rmtree(ws, ignore_errors=True)

    summary = ["| bar | measured | target | met |", "|---|---:|---:|---|"]
    for name, value, target, met in bars:
        verdict = "" if met is None else ("yes" if met else "no")
        summary.append(f"| {name} | {value:.2f} | {target} | {verdict} |")
    text = "\n".join([
        f"Machine: {machine}",
        f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; skillbox: the static-pie release binary; "
        f"medians; clean environment (env -i){'; QUICK' if QUICK else ''}",
        "",
        "### Issue 16's bars",
        "",
        *summary,
        "",
        *sections,
    ])
    with open(OUT, "w") as f:
        f.write(text)
    print(text)


main()
