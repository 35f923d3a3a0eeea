"""One-shot runs (POST /v1/run) through the client: the result, and its artifacts read
and downloaded from the server's store, checked against their sha256."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import py_compile
import subprocess
import sys
import typing
import urllib.request
from pathlib import Path

import pytest
from conftest import Server

from skillbox import Backend, Client, InvalidRequest, Sandbox

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
    # An existing file is kept unless asked.
    with pytest.raises(FileExistsError, match="overwrite"):
        report.download(tmp_path, name="report.txt")
    (tmp_path / "report.txt").write_text("mine")
    report.download(tmp_path, name="report.txt", overwrite=True)
    assert (tmp_path / "report.txt").read_text() == "rows: 3\n"
    # Nothing declared: a directory of the run's own, beneath the one given.
    everything = result.download_all(tmp_path / "all")
    assert sorted(p.name for p in everything) == ["blob.bin", "report.txt"]
    (own,) = (tmp_path / "all").iterdir()
    assert own.name.startswith("run-") and all(p.is_relative_to(own) for p in everything)
    assert not list(tmp_path.rglob(".skillbox-partial-*")), "no temporary file is left"
    with pytest.raises(KeyError, match=r"out/report\.txt"):
        result.artifact("nope.txt")
    with pytest.raises(ValueError):
        blob.download(tmp_path, name="../escape.bin")


def _payload(markers: Path) -> dict[str, bytes]:
    """Files a script plants for host tools to act on once copied out (as
    crates/skillbox/tests/doors.rs): a directory git opens as a repository, an
    unchecked-hash pyc beside the host's utils.py, and tar options as file names."""
    source = markers / "evil.py"
    source.write_text(f"open({str(markers / 'python')!r}, 'w').close()\n")
    compiled = markers / "evil.pyc"
    py_compile.compile(
        str(source), cfile=str(compiled), invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH
    )
    pyc = compiled.read_bytes()
    source.unlink()
    compiled.unlink()
    config = (
        "[core]\n\trepositoryformatversion = 0\n\tbare = false\n\tworktree = .\n"
        f'\tfsmonitor = "touch {markers / "git"}; false"\n'
    )
    return {
        "src/HEAD": b"ref: refs/heads/main\n",
        "src/config": config.encode(),
        "src/objects/info/packs": b"\n",
        "src/refs/heads/x": b"",
        importlib.util.cache_from_source("utils.py"): pyc,
        "--checkpoint=1": b"",
        "--checkpoint-action=exec=sh x.sh": b"",
        "x.sh": f"touch {markers / 'tar'}\n".encode(),
        "report.txt": b"the real output\n",
    }


def _victim(root: Path) -> Path:
    root.mkdir()
    (root / "src").mkdir()
    (root / "main.py").write_text("import utils\n")
    (root / "utils.py").write_text("pass\n")
    return root


def _host_commands(root: Path) -> None:
    """git status, python3 main.py and tar cf x.tar * in `root` and every directory below."""
    env = {**os.environ, "HOME": str(root.parent), "GIT_CONFIG_NOSYSTEM": "1"}
    for directory in [root, *(p for p in root.rglob("*") if p.is_dir() and not p.is_symlink())]:
        subprocess.run(["git", "status"], cwd=directory, env=env, capture_output=True, check=False)
        if (directory / "main.py").exists():
            subprocess.run(
                [sys.executable, "main.py"], cwd=directory, env=env, capture_output=True, check=False
            )
        subprocess.run(
            ["sh", "-c", 'tar cf "$HOME/x.tar" *'], cwd=directory, env=env, capture_output=True, check=False
        )


def test_downloads_never_plant_what_a_host_tool_runs(server: Server, tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    files = _payload(markers)
    # The payload is live: planted by hand, every host command runs it.
    live = _victim(tmp_path / "live")
    for path, data in files.items():
        (live / path).parent.mkdir(parents=True, exist_ok=True)
        (live / path).write_bytes(data)
    _host_commands(live)
    assert sorted(p.name for p in markers.iterdir()) == ["git", "python", "tar"]
    for marker in markers.iterdir():
        marker.unlink()

    script = (
        "import base64, json, os\n"
        f"files = json.loads({json.dumps({p: base64.b64encode(d).decode() for p, d in files.items()})!r})\n"
        "for p, d in files.items():\n"
        "    os.makedirs(os.path.dirname(p) or '.', exist_ok=True)\n"
        "    open(p, 'wb').write(base64.b64decode(d))\n"
    )
    with Client(server.url, server.keys["ana"]) as client:
        undeclared = client.run(script, language="python")
        declared = client.run(script, language="python", outputs=["**"])
    assert undeclared.ok and declared.ok, undeclared.stderr + declared.stderr
    for name, result in [("undeclared", undeclared), ("declared", declared)]:
        victim = _victim(tmp_path / name)
        with pytest.raises(ExceptionGroup) as refused:
            result.download_all(victim)
        assert refused.group_contains(PermissionError, match="never written")
        # One at a time, too: download() refuses the same names.
        for artifact in result.artifacts:
            if artifact.path.endswith("HEAD"):
                with pytest.raises(PermissionError, match="never written"):
                    artifact.download(victim)
        _host_commands(victim)
        assert list(markers.iterdir()) == [], f"{name}: a host command ran the payload"
        names = [str(p.relative_to(victim)) for p in victim.rglob("*")]
        assert not [n for n in names if n.endswith(("HEAD", ".pyc")) or Path(n).name.startswith("-")], names
        made = [n for n in names if n.endswith("report.txt")]
        assert made == (["report.txt"] if name == "declared" else [made[0]]) and made, names
        if name == "undeclared":
            assert made[0].startswith("run-"), names


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


def test_the_backends_offered_are_the_servers_own(server: Server) -> None:
    """`Backend` mirrors the server's `SandboxedKind` (every kind but host), read from
    its OpenAPI document: a kind added there fails here until the client has it."""
    request = urllib.request.Request(
        f"{server.url}/openapi.json", headers={"Authorization": f"Bearer {server.keys['ana']}"}
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        schema = json.load(answer)["components"]["schemas"]["SandboxedKind"]
    assert sorted(schema["enum"]) == sorted(typing.get_args(Backend))
