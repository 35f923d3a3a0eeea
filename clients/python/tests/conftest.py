"""A real `skillbox serve` for the tests: the binary from $SKILLBOX_BIN (else the
repository's target/debug/skillbox), a fresh data dir under a temp dir, a free port on
loopback, and API keys made with `skillbox keys new` for three tenants.

Without the binary or the native sandbox the tests skip, saying why; under
SKILLBOX_REQUIRE_ALL=1 (CI) that is a failure instead.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from skillbox import Client

REPO = Path(__file__).resolve().parents[3]


def _unavailable(reason: str) -> None:
    if os.environ.get("SKILLBOX_REQUIRE_ALL") == "1":
        pytest.fail(f"{reason} (SKILLBOX_REQUIRE_ALL=1: a skip is a failure)")
    pytest.skip(reason)


@dataclass(frozen=True)
class Server:
    url: str
    binary: Path
    data_dir: Path
    keys: dict[str, str]
    log: Path

    def client(self, tenant: str = "ana") -> Client:
        return Client(self.url, self.keys[tenant])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    binary = Path(os.environ.get("SKILLBOX_BIN") or REPO / "target" / "debug" / "skillbox")
    if not binary.is_file():
        _unavailable(f"no skillbox binary at {binary} (cargo build -p skillbox, or set SKILLBOX_BIN)")
    doctor = subprocess.run([binary, "doctor", "--json"], capture_output=True, text=True, check=False)
    try:
        backends = {b["name"]: b for b in json.loads(doctor.stdout)["backends"]}
    except (ValueError, KeyError):
        backends = {}
    native = backends.get("native", {})
    if not native.get("available"):
        _unavailable(
            f"the native sandbox is not available here: {native.get('reason') or doctor.stderr.strip()}"
        )

    scratch = Path(tempfile.mkdtemp(prefix="skillbox-python-"))
    data = scratch / "data"
    keys_file = scratch / "keys"
    keys: dict[str, str] = {}
    for tenant in ("ana", "bob", "carol"):
        made = subprocess.run(
            [binary, "keys", "new", tenant, "--file", keys_file], capture_output=True, text=True, check=True
        )
        keys[tenant] = made.stdout.strip()
    url = f"http://127.0.0.1:{_free_port()}"
    log = scratch / "serve.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [
                binary,
                "--data-dir",
                data,
                "serve",
                "--addr",
                url.removeprefix("http://"),
                "--api-keys",
                keys_file,
                "--warm-containers",
                "0",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        # The first start installs the Node runtime into the fresh data dir (npm ci).
        deadline = time.monotonic() + 300
        while not _healthy(url):
            if process.poll() is not None:
                pytest.fail(f"skillbox serve exited {process.returncode}:\n{log.read_text()[-4000:]}")
            if time.monotonic() > deadline:
                pytest.fail(
                    f"skillbox serve did not answer /healthz within 300 s:\n{log.read_text()[-4000:]}"
                )
            time.sleep(0.1)
        yield Server(url=url, binary=binary, data_dir=data, keys=keys, log=log)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture
def client(server: Server) -> Iterator[Client]:
    with server.client("ana") as client:
        yield client


def host_processes(*argv: str) -> list[int]:
    """The host's processes whose command line is `argv` (native sandboxes run as host
    processes in their own namespaces, so a marker command is seen from here)."""
    want = b"\0".join(a.encode() for a in argv) + b"\0"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if cmdline == want:
            found.append(int(entry.name))
    return found


def wait_until(what: str, check: Callable[[], bool], within: float = 20.0) -> None:
    """Polls `check` until it holds; fails naming `what` after `within` seconds."""
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {within} s")
        time.sleep(0.02)
