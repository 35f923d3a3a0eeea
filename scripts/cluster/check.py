#!/usr/bin/env python3
"""Drives the cluster scripts/cluster.sh starts, through its balancer, and checks it.

    check.py make-bucket NAME   # a bucket in moto (AWS_ENDPOINT_URL), before the nodes start
    check.py run                # the checks; CLUSTER_* variables from cluster.sh
    check.py wait               # until every node and the balancer answer

Each check prints a line `ok  what` or `FAIL what: why`; the exit status is 0 only when
every one held. Only the standard library: it runs before any venv of the repo.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

FAKE_AUTH = (
    "AWS4-HMAC-SHA256 Credential=cluster/20260101/us-east-1/s3/aws4_request, "
    "SignedHeaders=host, Signature=" + "0" * 64
)


def request(method: str, url: str, body: bytes | None = None, token: str | None = None,
            content_type: str | None = None, timeout: float = 120) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if content_type:
        req.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def make_bucket(name: str) -> None:
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    deadline = time.monotonic() + 60
    while True:
        try:
            req = urllib.request.Request(f"{endpoint}/{name}", method="PUT", data=b"")
            req.add_header("Authorization", FAKE_AUTH)
            with urllib.request.urlopen(req, timeout=10) as answer:
                assert answer.status == 200, answer.status
            return
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class Cluster:
    def __init__(self) -> None:
        work = os.environ["CLUSTER_WORK"]
        self.work = work
        self.lb = os.environ["CLUSTER_LB"]
        self.db = os.environ["CLUSTER_DB"]
        self.psql_bin = os.environ["CLUSTER_PSQL"]
        self.nodes = dict(pair.split("=", 1) for pair in os.environ["CLUSTER_NODES"].split(","))
        with open(f"{work}/token") as f:
            self.token = f.read().strip()
        with open(f"{work}/token-globex") as f:
            self.other_token = f.read().strip()
        self.failures = 0
        # Files of runs the cluster answered: what must outlive a node.
        self.acknowledged: list[tuple[str, bytes]] = []

    def call(self, method: str, path: str, body: object | bytes | None = None,
             base: str | None = None) -> tuple[int, bytes]:
        data: bytes | None
        content_type = None
        if body is None:
            data = None
        elif isinstance(body, bytes):
            data = body
        else:
            data = json.dumps(body).encode()
            content_type = "application/json"
        return request(method, (base or self.lb) + path, data, self.token, content_type)

    def json(self, method: str, path: str, body: object | None = None,
             base: str | None = None) -> dict:
        status, raw = self.call(method, path, body, base)
        if not 200 <= status < 300:
            raise AssertionError(f"{method} {path}: {status} {raw[:500]!r}")
        return json.loads(raw)

    def psql(self, sql: str) -> str:
        out = subprocess.run([self.psql_bin, self.db, "-X", "-A", "-t", "-c", sql],
                             capture_output=True, text=True, check=True)
        return out.stdout.strip()

    def check(self, what: str, fn) -> None:
        started = time.monotonic()
        try:
            detail = fn()
            took = time.monotonic() - started
            print(f"ok    {what} ({took:.1f} s){': ' + detail if detail else ''}", flush=True)
        except Exception as e:  # noqa: BLE001 - every failure is reported, then counted
            self.failures += 1
            print(f"FAIL  {what}: {e}", flush=True)

    def alive(self, node: str) -> bool:
        """Whether the node's process is still running (not ended, nor a zombie)."""
        with open(f"{self.work}/{node.replace('n', 'node')}.pid") as f:
            pid = int(f.read())
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    def wait_ready(self) -> str:
        deadline = time.monotonic() + 300
        for name, base in self.nodes.items():
            while True:
                try:
                    if request("GET", base + "/healthz", timeout=5)[0] == 200:
                        break
                except (urllib.error.URLError, ConnectionError, TimeoutError):
                    pass
                if time.monotonic() > deadline:
                    raise AssertionError(f"node {name} at {base} never answered /healthz")
                if not self.alive(name):
                    raise AssertionError(f"node {name} ended before it answered /healthz")
                time.sleep(0.2)
        # The balancer's own checks take each node in.
        while request("GET", self.lb + "/healthz", timeout=5)[0] != 200:
            if time.monotonic() > deadline:
                raise AssertionError("the balancer never answered")
            time.sleep(0.2)
        return f"{len(self.nodes)} nodes and the balancer answer"

    def a_run_lands_in_postgres_and_the_bucket(self) -> str:
        nonce = os.urandom(8).hex()
        run = self.json("POST", "/v1/run", {
            "language": "sh", "script": f"printf 'cluster {nonce}\\n' > out.txt"})
        made = f"cluster {nonce}\n".encode()
        sha = run["files"][0]["sha256"]
        self.acknowledged.append((sha, made))
        owners = self.psql(f"SELECT count(*) FROM object_owners WHERE sha256 = '{sha}'")
        assert owners == "1", f"object_owners has {owners} rows for it"
        runs = self.psql(f"SELECT count(*) FROM plain_runs WHERE body LIKE '%{sha}%'")
        assert runs == "1", f"plain_runs has {runs} rows for it"
        endpoint = os.environ["AWS_ENDPOINT_URL"]
        req = urllib.request.Request(f"{endpoint}/cluster/skillbox/objects/{sha[:2]}/{sha}")
        req.add_header("Authorization", FAKE_AUTH)
        with urllib.request.urlopen(req, timeout=30) as answer:
            assert answer.read() == made, "the bucket holds other bytes"
        for name, base in self.nodes.items():
            status, body = self.call("GET", f"/v1/objects/{sha}", base=base)
            assert (status, body) == (200, made), f"node {name}: {status} {body[:200]!r}"
        return f"{sha[:12]}… in plain_runs, object_owners and the bucket; served by n1, n2, n3"

    def a_session_is_used_fifty_times(self) -> str:
        session = self.json("POST", "/v1/sessions", {})
        sid = session["id"]
        home = sid.rsplit(".", 1)[1]
        for i in range(50):
            status, body = self.call("PUT", f"/v1/sessions/{sid}/files/n{i}.txt", f"{i}".encode())
            assert 200 <= status < 300, f"write {i}: {status} {body[:300]!r}"
            status, body = self.call("POST", f"/v1/sessions/{sid}/exec",
                                     {"shell": f"cat n{i}.txt; ls | wc -l"})
            assert status == 200, f"exec {i}: {status} {body[:300]!r}"
            out = "".join(json.loads(line).get("data", "")
                          for line in body.decode().splitlines() if line.strip())
            assert out == f"{i}{i + 1}\n", f"exec {i}: {out!r}"
        # The forward is a door too: what reaches the session's node is what the client
        # could ask for itself. Without a key: 401 at the node it lands on; another
        # tenant's key: 404 wherever it lands (its own node, or forwarded); a forged
        # forward mark reaches no other node (404 where it lands) and is no key.
        path = f"/v1/sessions/{sid}"
        for base in self.nodes.values():
            status, _ = request("GET", base + path)
            assert status == 401, f"no key at {base}: {status}"
            status, _ = request("GET", base + path, token=self.other_token)
            assert status == 404, f"another tenant at {base}: {status}"
        for name, base in self.nodes.items():
            req = urllib.request.Request(base + path)
            req.add_header("Authorization", f"Bearer {self.token}")
            req.add_header("X-Skillbox-Forwarded-By", "forged")
            try:
                with urllib.request.urlopen(req, timeout=30) as answer:
                    status = answer.status
            except urllib.error.HTTPError as e:
                status = e.code
            assert status == (200 if name == home else 404), f"forged mark at {name}: {status}"
            req = urllib.request.Request(base + path)
            req.add_header("X-Skillbox-Forwarded-By", home)
            try:
                with urllib.request.urlopen(req, timeout=30) as answer:
                    status = answer.status
            except urllib.error.HTTPError as e:
                status = e.code
            assert status == 401, f"a forward mark without a key at {name}: {status}"
        status, _ = self.call("DELETE", f"/v1/sessions/{sid}")
        assert 200 <= status < 300, f"delete: {status}"
        return (f"{sid} lives on {home}; 100 requests through the balancer; no key, another "
                "tenant's key and a forged forward mark refused at every node")

    def a_node_killed_mid_run_loses_nothing_acknowledged(self) -> str:
        # More acknowledged runs, spread by the balancer over the nodes.
        for i in range(6):
            nonce = os.urandom(8).hex()
            run = self.json("POST", "/v1/run", {
                "language": "sh", "script": f"printf 'before {i} {nonce}\\n' > f.txt"})
            self.acknowledged.append((run["files"][0]["sha256"],
                                      f"before {i} {nonce}\n".encode()))
        agent = self.json("POST", "/v1/agent/runs", {"prompt": "wait", "maxAttempts": 1})
        run_id = agent["id"]
        node = self.psql(f"SELECT node FROM agent_runs WHERE id = '{run_id}'")
        assert node in self.nodes, f"the record names node {node!r}"
        with open(f"{self.work}/{node.replace('n', 'node')}.pid") as f:
            pid = int(f.read())
        os.kill(pid, 9)
        killed = time.monotonic()
        deadline = killed + 60
        while True:
            record = self.json("GET", f"/v1/agent/runs/{run_id}")
            if record["status"] != "running":
                break
            assert time.monotonic() < deadline, "the dead node's run stayed running"
            time.sleep(0.2)
        closed_after = time.monotonic() - killed
        assert record["status"] == "failed", record
        assert f"node {node} stopped answering" in record.get("reason", ""), record
        for sha, made in self.acknowledged:
            status, body = self.call("GET", f"/v1/objects/{sha}")
            assert (status, body) == (200, made), f"{sha}: {status} {body[:200]!r}"
        for i in range(6):
            run = self.json("POST", "/v1/run", {"language": "sh", "script": "echo after"})
            assert run["stdout"] == "after\n", run
        return (f"killed {node} (its agent run recorded failed {closed_after:.1f} s later); "
                f"{len(self.acknowledged)} acknowledged files served; 6 new runs answered")


def main() -> int:
    if sys.argv[1:2] == ["make-bucket"]:
        make_bucket(sys.argv[2])
        return 0
    cluster = Cluster()
    if sys.argv[1:2] == ["wait"]:
        cluster.wait_ready()
        return 0
    cluster.check("three nodes and the balancer up", cluster.wait_ready)
    if cluster.failures:
        return 1
    cluster.check("a run through the balancer lands in Postgres and the bucket, "
                  "downloadable from every node", cluster.a_run_lands_in_postgres_and_the_bucket)
    cluster.check("a session created through the balancer is used through it 50 times",
                  cluster.a_session_is_used_fifty_times)
    cluster.check("a node killed with SIGKILL mid-run: the others go on, nothing "
                  "acknowledged is lost", cluster.a_node_killed_mid_run_loses_nothing_acknowledged)
    print(f"cluster: {'every check held' if not cluster.failures else f'{cluster.failures} failed'}")
    return 1 if cluster.failures else 0


if __name__ == "__main__":
    sys.exit(main())
