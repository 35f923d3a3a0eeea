"""The measurements of bench/scale.sh, run by scripts/cluster.sh against its cluster
(the CLUSTER_* variables). Prints a table for docs/benchmarks.md."""

import json
import os
import re
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request

ROUNDS = int(os.environ.get("ROUNDS") or 3)
REQUESTS = int(os.environ.get("REQUESTS") or 400)
CONCURRENCY = int(os.environ.get("CONCURRENCY") or 8)
SESSIONS = int(os.environ.get("SESSIONS") or 500)

work = os.environ["CLUSTER_WORK"]
lb = os.environ["CLUSTER_LB"]
nodes = dict(pair.split("=", 1) for pair in os.environ["CLUSTER_NODES"].split(","))
token = open(f"{work}/token").read().strip()
binary = os.environ["CLUSTER_BIN"]
HZ = os.sysconf("SC_CLK_TCK")
BODY = json.dumps({"language": "sh", "script": "echo hi > out.txt"})


def haproxy(command):
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(f"{work}/haproxy.sock")
        s.sendall(command.encode() + b"\n")
        return s.recv(65536).decode()


def serve_with(n):
    """The balancer sends to n1..nN only."""
    for i, name in enumerate(sorted(nodes), start=1):
        haproxy(f"{'enable' if i <= n else 'disable'} server nodes/{name}")
    time.sleep(1)


def cpu_by_group():
    """CPU seconds so far by who: the nodes (their reaped sandboxes with them),
    Postgres, moto, HAProxy, the lone server."""
    groups = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{pid}/stat").read()
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))
        comm = stat.split("(", 1)[1].rsplit(")", 1)[0]
        if comm == "postgres":
            group = "postgres"
        elif "moto_server" in cmdline:
            group = "moto"
        elif comm == "haproxy":
            group = "haproxy"
        elif " serve " in cmdline:
            group = "skillbox alone" if " --node alone" in cmdline else "skillbox nodes"
        else:
            continue
        groups[group] = groups.get(group, 0) + ticks / HZ
    return groups


def ab(url):
    with tempfile.NamedTemporaryFile("w", suffix=".json") as body:
        body.write(BODY)
        body.flush()
        out = subprocess.run(
            ["ab", "-q", "-n", str(REQUESTS), "-c", str(CONCURRENCY), "-p", body.name,
             "-T", "application/json", "-H", f"Authorization: Bearer {token}", url],
            capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests per second:\s+([\d.]+)", out).group(1))
    # ab counts an answer of another length than the first as failed; a run's answer
    # (its duration) varies in length, so only the other kinds count here.
    kinds = re.search(r"\(Connect: (\d+), Receive: (\d+), Length: \d+, Exceptions: (\d+)\)", out)
    non2xx = re.search(r"Non-2xx responses:\s+(\d+)", out)
    assert not non2xx and (not kinds or kinds.groups() == ("0", "0", "0")), out
    return rps


def lone_server(name, extra=()):
    """One server alone on loopback, the same binary: its records in SQLite files and
    its objects in its data dir, unless `extra` says otherwise."""
    data = os.path.join(work, name)
    os.makedirs(data, exist_ok=True)
    subprocess.run(["cp", "-a", f"{work}/node1/runtimes", data], check=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [binary, "--data-dir", data, "serve", "--addr", f"127.0.0.1:{port}",
         "--api-keys", f"{work}/keys", "--node", name, *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            urllib.request.urlopen(url + "/healthz", timeout=2)
            break
        except OSError:
            time.sleep(0.1)
    return proc, url


def measure_throughput():
    alone, alone_url = lone_server("alone")
    alone_pg, alone_pg_url = lone_server("alone-pg", ("--db", os.environ["CLUSTER_DB"]))
    rows = {
        "one server alone (SQLite, data dir)": ("alone", alone_url),
        "one server alone (Postgres, data dir)": ("alone", alone_pg_url),
    }
    for n in (1, 2, 3):
        rows[f"{n} node{'s' if n > 1 else ''} via HAProxy (Postgres, S3)"] = ("lb", n)
    results = {name: [] for name in rows}
    cpu = {name: {} for name in rows}
    names = list(rows)
    for r in range(ROUNDS):
        order = names if r % 2 == 0 else list(reversed(names))
        for name in order:
            kind, arg = rows[name]
            if kind == "lb":
                serve_with(arg)
            before = cpu_by_group()
            start = time.monotonic()
            rps = ab((arg if kind == "alone" else lb) + "/v1/run")
            wall = time.monotonic() - start
            after = cpu_by_group()
            results[name].append(rps)
            for group, seconds in after.items():
                share = (seconds - before.get(group, 0)) / wall
                cpu[name].setdefault(group, []).append(share)
    serve_with(3)
    for proc in (alone, alone_pg):
        proc.terminate()
        proc.wait()
    print(f"\nPOST /v1/run (sh, one file), ab -n {REQUESTS} -c {CONCURRENCY}, "
          f"{ROUNDS} rounds, alternating order; median requests/s, and the cores each part "
          "used while it ran (median)")
    print("| setup | runs/s (each round) | cores: skillbox (with its sandboxes) | Postgres | moto (S3) | HAProxy |")
    print("|---|---|---|---|---|---|")
    for name in names:
        c = {g: statistics.median(v) for g, v in cpu[name].items()}
        sk = c.get("skillbox alone" if "alone" in name else "skillbox nodes", 0)
        each = ", ".join(f"{x:.0f}" for x in results[name])
        print(f"| {name} | **{statistics.median(results[name]):.0f}** ({each}) | {sk:.2f} | "
              f"{c.get('postgres', 0):.2f} | {c.get('moto', 0):.2f} | {c.get('haproxy', 0):.2f} |")


def measure_hop():
    """A session exec straight to its node, and through another node (forwarded)."""
    req = urllib.request.Request(nodes["n1"] + "/v1/sessions", data=b"{}", method="POST")
    req.add_header("Authorization", f"Bearer {token}")
    req.add_header("Content-Type", "application/json")
    sid = json.load(urllib.request.urlopen(req))["id"]
    exec_body = json.dumps({"shell": "true"}).encode()

    def one(base):
        r = urllib.request.Request(f"{base}/v1/sessions/{sid}/exec", data=exec_body, method="POST")
        r.add_header("Authorization", f"Bearer {token}")
        r.add_header("Content-Type", "application/json")
        start = time.perf_counter()
        urllib.request.urlopen(r).read()
        return (time.perf_counter() - start) * 1000

    direct, forwarded = [], []
    for i in range(200):
        pair = [(direct, nodes["n1"]), (forwarded, nodes["n2"])]
        for sink, base in (pair if i % 2 == 0 else reversed(pair)):
            sink.append(one(base))
    print("\nA session exec (`true`), 200 pairs alternating: straight to its node, and "
          "through another node that forwards it")
    print("| path | median ms | p90 ms |")
    print("|---|---|---|")
    for name, values in (("to its node", direct), ("forwarded by another node", forwarded)):
        values.sort()
        print(f"| {name} | {statistics.median(values):.2f} | {values[int(len(values) * 0.9)]:.2f} |")
    r = urllib.request.Request(f"{nodes['n1']}/v1/sessions/{sid}", method="DELETE")
    r.add_header("Authorization", f"Bearer {token}")
    urllib.request.urlopen(r).read()


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def descendants(pid):
    kids = {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        kids.setdefault(ppid, []).append(int(p))
    out, todo = [], [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out


def pss_kib(pids):
    total = 0
    for p in pids:
        try:
            for line in open(f"/proc/{p}/smaps_rollup"):
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


def measure_idle_sessions():
    pid = int(open(f"{work}/node1.pid").read())
    # `ip netns exec` runs the node: its pid is the node's own (exec'd).
    before_rss, before_kids = rss_kib(pid), pss_kib(descendants(pid))
    ids = []
    start = time.monotonic()
    for i in range(SESSIONS):
        req = urllib.request.Request(nodes["n1"] + "/v1/sessions", data=b"{}", method="POST")
        req.add_header("Authorization", f"Bearer {token}")
        req.add_header("Content-Type", "application/json")
        ids.append(json.load(urllib.request.urlopen(req))["id"])
    took = time.monotonic() - start
    time.sleep(2)
    after_rss, kids = rss_kib(pid), descendants(pid)
    after_kids = pss_kib(kids)
    print(f"\n{SESSIONS} idle native sessions on one node (opened in {took:.1f} s)")
    print("| | before | with them | each |")
    print("|---|---|---|---|")
    print(f"| the node's RSS | {before_rss / 1024:.1f} MiB | {after_rss / 1024:.1f} MiB | "
          f"{(after_rss - before_rss) / SESSIONS:.0f} KiB |")
    print(f"| its sandboxes' processes (PSS), {len(kids)} | {before_kids / 1024:.1f} MiB | "
          f"{after_kids / 1024:.1f} MiB | {(after_kids - before_kids) / SESSIONS:.0f} KiB |")
    for sid in ids:
        r = urllib.request.Request(f"{nodes['n1']}/v1/sessions/{sid}", method="DELETE")
        r.add_header("Authorization", f"Bearer {token}")
        urllib.request.urlopen(r).read()


if __name__ == "__main__":
    print(f"bench/scale.sh on {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}, {binary}")
    measure_throughput()
    measure_hop()
    measure_idle_sessions()
