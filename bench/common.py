"""Helpers shared by the Python parts of the benchmarks in bench/."""

import json
import os
import socket
import subprocess
import tempfile
import threading
import time


def rate(worker, concurrency, seconds):
    """Completions per second of `worker()` from `concurrency` threads for `seconds`."""
    counts = [0] * concurrency
    end = time.monotonic() + seconds

    def loop(i):
        state = {}
        while time.monotonic() < end:
            worker(state)
            counts[i] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(concurrency)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.monotonic() - start)


def hyperfine(rounds, runs, commands, prepare=None):
    """Each command's samples, pooled from `rounds` hyperfine runs; the commands'
    order is reversed every other round so neither always goes first. `prepare`: a
    command hyperfine runs before each sample (untimed)."""
    pooled = {name: [] for name, _ in commands}
    for round_ in range(rounds):
        order = commands if round_ % 2 == 0 else list(reversed(commands))
        with tempfile.NamedTemporaryFile(suffix=".json") as export:
            args = ["hyperfine", "-N", "--warmup", "3", "--runs", str(runs),
                    "--export-json", export.name]
            if prepare:
                args += ["--prepare", prepare]
            for name, command in order:
                args += ["-n", name, command]
            subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for result in json.load(open(export.name))["results"]:
                pooled[result["command"]].extend(result["times"])
    return pooled


class Warm:
    """A `skillbox warm` on its own data dir (its socket in it), stopped on exit."""

    def __init__(self, skillbox, data):
        self.data = data
        socket_path = os.path.join(data, "warm.sock")
        self.process = subprocess.Popen([skillbox, "--data-dir", data, "warm"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(300):
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(socket_path)
                time.sleep(0.5)  # its first sandboxes made ahead
                return
            except OSError:
                time.sleep(0.1)
        raise SystemExit("bench: skillbox warm did not answer")

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.process.terminate()
        self.process.wait(timeout=60)


def bwrap_yardstick():
    """The bwrap command line the native rows are measured against (its program to
    follow), and the host directory of its /workspace (the caller removes it): every
    namespace, the system read-only, a fresh /workspace of the sandbox user's (uid 65534
    under root), as a skillbox sandbox has."""
    ws = tempfile.mkdtemp()
    os.chmod(ws, 0o755)
    if os.getuid() == 0:
        os.chown(ws, 65534, 65534)
    return ("bwrap --unshare-all --die-with-parent --new-session "
            "--ro-bind /usr /usr --symlink usr/bin /bin --symlink usr/lib /lib --symlink usr/lib64 /lib64 "
            "--symlink usr/sbin /sbin --ro-bind /etc/ld.so.cache /etc/ld.so.cache "
            "--ro-bind /etc/ssl/certs /etc/ssl/certs --proc /proc --dev /dev --tmpfs /tmp "
            f"--bind {ws} /workspace --chdir /workspace"), ws
