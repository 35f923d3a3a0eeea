"""One-shot runs (POST /v1/run) through the client: the result, and its artifacts read
and downloaded from the server's store, checked against their sha256."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from conftest import Server

from skillbox import Client, InvalidRequest, Sandbox

SCRIPT = """
import os, sys
os.makedirs("out", exist_ok=True)
with open("out/report.txt", "w") as f:
    f.write("rows: " + open("input.csv").read().count("\\n").__str__() + "\\n")
with open("out/blob.bin", "wb") as f:
    f.write(bytes(range(256)) * 64)
print("made two files")
print("a warning", file=sys.stderr)
"""


def test_run_returns_artifacts_that_download(server: Server, tmp_path: Path) -> None:
    with Sandbox.create(server.url, server.keys["ana"]) as sandbox:
        result = sandbox.run(SCRIPT, language="python", files={"input.csv": "a,b\n1,2\n3,4\n"}, timeout=30)
    assert result.ok, result.stderr
    assert result.stdout == "made two files\n"
    assert result.stderr == "a warning\n"
    # The input is not an artifact: only what the run made.
    assert sorted(a.path for a in result.artifacts) == ["out/blob.bin", "out/report.txt"]

    report = result.artifact("out/report.txt")
    assert report.content_type.startswith("text/plain")
    assert report.text() == "rows: 3\n"
    blob = result.artifact("out/blob.bin")
    expected = bytes(range(256)) * 64
    assert blob.size == len(expected) and blob.sha256 == hashlib.sha256(expected).hexdigest()
    assert blob.read() == expected

    saved = blob.download(tmp_path)
    assert saved == tmp_path / "out" / "blob.bin"
    assert saved.read_bytes() == expected
    assert report.download(tmp_path, name="report.txt").read_text() == "rows: 3\n"
    assert sorted(p.name for p in result.download_all(tmp_path / "all")) == ["blob.bin", "report.txt"]
    assert not list(tmp_path.rglob("*.part")), "no temporary file is left"
    with pytest.raises(KeyError, match=r"out/report\.txt"):
        result.artifact("nope.txt")
    with pytest.raises(ValueError):
        blob.download(tmp_path, name="../escape.bin")


def test_run_without_a_session_and_its_errors(server: Server) -> None:
    with Client(server.url, server.keys["bob"]) as client:
        result = client.run("require('fs').writeFileSync('hi.txt', 'hi')", language="node")
        assert result.ok and [a.path for a in result.artifacts] == ["hi.txt"]
        assert result.artifacts[0].read() == b"hi"
        failed = client.run("exit 7", language="sh")
        assert failed.exit_code == 7 and not failed.ok
        slow = client.run("sleep 10", language="sh", timeout=0.5)
        assert slow.timed_out
        with pytest.raises(InvalidRequest) as bad:
            client.run("print(1)", files={"../out.txt": "x"})
        assert bad.value.code == "invalid" and "files" in bad.value.message


FETCH = """
import os, urllib.request, urllib.error
print("proxy", os.environ.get("HTTPS_PROXY"))
try:
    urllib.request.urlopen("http://not-listed.example/", timeout=10)
except urllib.error.HTTPError as e:
    print("HTTP", e.code)
except Exception as e:
    print("ERROR", type(e).__name__)
"""


def test_network_goes_through_the_egress_proxy_only_where_allowed(server: Server) -> None:
    client = Client(server.url, server.keys["ana"])
    result = client.run(FETCH, allow_net=["files.example.org"], timeout=30)
    assert result.stdout == "proxy http://127.0.0.1:3128\nHTTP 403\n", result.stderr
    [refused] = result.egress
    assert (refused.host, refused.port, refused.verdict) == ("not-listed.example", 80, "refused")
    assert refused.reason is not None and "network.allow" in refused.reason

    # No allow_net: no proxy, no network, nothing recorded.
    result = client.run(FETCH, timeout=30)
    assert result.stdout.startswith("proxy None\nERROR"), result.stdout
    assert result.egress == []

    # A session's commands get it too, and its record lists what they asked for.
    with Sandbox.create(server.url, server.keys["ana"], allow_net=["files.example.org"]) as sandbox:
        done = sandbox.exec(["python3", "-c", FETCH]).wait()
        assert done.stdout == "proxy http://127.0.0.1:3128\nHTTP 403\n"
        assert [c.host for c in sandbox.refresh().egress] == ["not-listed.example"]

    with pytest.raises(InvalidRequest, match=r"network\.allow\[0\]"):
        client.run(FETCH, allow_net=["https://x.example/"])
    with pytest.raises(ValueError, match="deny_net needs allow_net"):
        client.run(FETCH, deny_net=["x.example"])
