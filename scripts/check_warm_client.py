#!/usr/bin/env python3
"""Runs every path of the entry point's warm client in a binary (the static-pie one).

    scripts/check_warm_client.py BINARY

`skillbox exec -- CMD` is sent to `skillbox warm` by the binary's entry point, before
glibc starts (crates/skillbox-entry). In the static-pie binary a mistake there crashes
only that binary, so this runs each of its paths there: answers the same as without a
server (output, status, `--json`, escapes, output past the relay's buffer, a closed
stdout or stderr), the data dir from `--data-dir=`, `SKILLBOX_DATA`, `HOME` and a
relative path, a data dir others may write, with a symlink or a directory others may
write in it, and a socket that is a link (not used),
Ctrl-C, and fake servers: of another version, of another user and of this uid in
another user namespace, also seen from a pid namespace of the client's own (the
client runs the command itself), and one that goes away
(the client says so). Exits 1 naming the case that differs.
"""

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

BINARY = os.path.abspath(sys.argv[1])
CLEAN = {"PATH": "/usr/local/bin:/usr/bin:/bin"}


def fail(message):
    sys.exit(f"check_warm_client: {message}")


def run(args, env=None, data=None):
    prefix = [BINARY] + (["--data-dir", data] if data else [])
    return subprocess.run(prefix + args, capture_output=True, env=env or CLEAN, timeout=120)


def wait_for(what, ready, seconds=60):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.05)
    fail(f"{what}: not within {seconds} s")


def served(log):
    with open(log) as f:
        return f.read().count("warm: an exec")


def sleeping(nap):
    """Whether a `sleep NAP` runs (in a sandbox or not)."""
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read() == b"sleep\0" + nap.encode() + b"\0":
                    return True
        except OSError:
            pass
    return False


SERVE_ONCE = r"""
import os, socket, struct, sys
listener = socket.socket(fileno=int(sys.argv[1]))
listener.listen(1)
print("listening", flush=True)
listener.settimeout(60)
conn, _ = listener.accept()
# One client only: the one that falls back finds no server.
listener.close()
conn.settimeout(5)
got = b""
try:
    head = conn.recv(4, socket.MSG_WAITALL)
    if len(head) == 4:
        got = head + conn.recv(struct.unpack("<I", head)[0], socket.MSG_WAITALL)
    conn.sendall(bytes.fromhex(sys.argv[2]))
except OSError:
    pass
conn.close()
sys.exit(0 if got else 3)
"""


def fake_server(path, answer, prefix=()):
    """A server at `path`, listening when this returns, that reads one request and
    answers `answer` (bytes). It listens under `prefix` (setpriv to another user,
    unshare into another user namespace): the credentials a client sees are the
    listener's. Returns the process, for `fake_answered`."""
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    server = subprocess.Popen(
        [*prefix, "python3", "-c", SERVE_ONCE, str(listener.fileno()), answer.hex()],
        pass_fds=[listener.fileno()], stdout=subprocess.PIPE)
    listener.close()
    if server.stdout.readline() != b"listening\n":
        fail(f"a fake server under {prefix} did not start")
    return server


def fake_answered(server, path):
    """Whether the fake server read a request (it exits 3 when nothing came)."""
    server.wait(timeout=60)
    os.unlink(path)
    return server.returncode == 0


def main():
    scratch = tempfile.mkdtemp(prefix="skillbox-warm-client-")
    warm_data = os.path.join(scratch, "warm")
    cold_data = os.path.join(scratch, "cold")
    for d in (warm_data, cold_data):
        os.mkdir(d, 0o700)
    log_path = os.path.join(scratch, "warm.log")
    log = open(log_path, "w")
    server = subprocess.Popen([BINARY, "--data-dir", warm_data, "warm"], stdout=log,
                              stderr=log, env=dict(CLEAN, SKILLBOX_LOG="skillbox=debug"))
    sock = os.path.join(warm_data, "warm.sock")
    try:
        wait_for("skillbox warm's socket", lambda: os.path.exists(sock))
        cases = [
            ["exec", "--", "sh", "-c", "echo out; echo err >&2; exit 3"],
            ["exec", "--json", "--", "sh", "-c", 'printf "%s|" "$@"', "x",
             'a "quoted" \\ back\nslash\t\x01', "é 🙂", ""],
            ["exec", "--", "sh", "-c", "head -c 200000 /dev/zero | tr '\\0' a; echo"],
            ["exec", "--", "no-such-command-here"],
        ]
        for args in cases:
            before = served(log_path)
            warm, cold = run(args, data=warm_data), run(args, data=cold_data)
            if served(log_path) != before + 1:
                fail(f"{args}: not served by skillbox warm")
            if args[1] == "--json":
                warm_out, cold_out = json.loads(warm.stdout), json.loads(cold.stdout)
                warm_out["durationMs"] = cold_out["durationMs"] = None
            else:
                warm_out, cold_out = warm.stdout, cold.stdout
            got = (warm.returncode, warm_out, warm.stderr)
            want = (cold.returncode, cold_out, cold.stderr)
            if got != want:
                fail(f"{args}: through skillbox warm {got!r:.400}, without {want!r:.400}")
        # Where the data dir comes from: --data-dir=, SKILLBOX_DATA, HOME.
        home = os.path.join(scratch, "home")
        os.makedirs(os.path.join(home, ".local/share"), 0o700)
        os.symlink(warm_data, os.path.join(home, ".local/share/skillbox"))
        for label, args, env in [
            ("--data-dir=", [f"--data-dir={warm_data}", "exec", "--", "echo", "ok"], None),
            ("SKILLBOX_DATA", ["exec", "--", "echo", "ok"],
             dict(CLEAN, SKILLBOX_DATA=warm_data, HOME="/nonexistent")),
            ("HOME", ["exec", "--", "echo", "ok"], dict(CLEAN, HOME=home)),
        ]:
            before = served(log_path)
            out = run(args, env=env)
            if (out.returncode, out.stdout) != (0, b"ok\n") or served(log_path) != before + 1:
                fail(f"the data dir from {label}: {out}")
        # A relative data dir, as main makes it absolute.
        before = served(log_path)
        out = subprocess.run([BINARY, "--data-dir", "warm", "exec", "--", "echo", "ok"],
                             capture_output=True, env=CLEAN, cwd=scratch, timeout=120)
        if (out.returncode, out.stdout) != (0, b"ok\n") or served(log_path) != before + 1:
            fail(f"a relative data dir: {out}")
        # A closed stdout or stderr: the socket must not take its number.
        both = ["exec", "--", "sh", "-c", "echo a; sleep 0.3; echo b >&2; exit 3"]
        for fd in (1, 2):
            before = served(log_path)
            got = [subprocess.run([BINARY, "--data-dir", data, *both], env=CLEAN,
                                  timeout=120, capture_output=True,
                                  preexec_fn=lambda fd=fd: os.close(fd))
                   for data in (warm_data, cold_data)]
            if served(log_path) != before + 1:
                fail(f"fd {fd} closed: not served by skillbox warm")
            if [(g.returncode, g.stdout, g.stderr) for g in got[:1]] != \
                    [(g.returncode, g.stdout, g.stderr) for g in got[1:]]:
                fail(f"fd {fd} closed: through skillbox warm {got[0]}, without {got[1]}")
        # A data dir others may write, or a socket that is a link, is not trusted: the
        # full client refuses them as it always has.
        os.chmod(warm_data, 0o777)
        before = served(log_path)
        out = run(["exec", "--", "echo", "x"], data=warm_data)
        os.chmod(warm_data, 0o700)
        if served(log_path) != before or out.returncode != 125 or \
                b"writable by group or others" not in out.stderr:
            fail(f"a data dir others may write: {out}")
        # As own_data_dir: no symlink in it, no directory in it others may write.
        for label, plant, undo in [
            ("a symlink in it", lambda p: os.symlink("/etc", p), os.unlink),
            ("a directory in it others may write",
             lambda p: (os.mkdir(p), os.chmod(p, 0o777)), os.rmdir),
        ]:
            planted = os.path.join(warm_data, "planted")
            plant(planted)
            before = served(log_path)
            out = run(["exec", "--", "echo", "x"], data=warm_data)
            undo(planted)
            if served(log_path) != before or out.returncode != 125:
                fail(f"a data dir with {label}: {out}")
        linked = os.path.join(scratch, "linked")
        os.mkdir(linked, 0o700)
        os.symlink(sock, os.path.join(linked, "warm.sock"))
        before = served(log_path)
        out = run(["exec", "--", "echo", "x"], data=linked)
        if served(log_path) != before or out.returncode != 125 or b"symlink" not in out.stderr:
            fail(f"a socket that is a link: {out}")
        # Ctrl-C: the client says what exec says for a cancel, and ends with 125.
        def interrupted(data, nap):
            client = subprocess.Popen([BINARY, "--data-dir", data, "exec", "--", "sleep",
                                       nap], stderr=subprocess.PIPE, env=CLEAN)
            wait_for("the sleep", lambda: sleeping(nap))
            client.send_signal(signal.SIGINT)
            _, err = client.communicate(timeout=30)
            wait_for("the sleep's end", lambda: not sleeping(nap))
            return client.returncode, err
        warm = interrupted(warm_data, f"30.{os.getpid()}1")
        cold = interrupted(cold_data, f"30.{os.getpid()}2")
        if warm != cold or warm[0] != 125:
            fail(f"Ctrl-C: through skillbox warm {warm}, without {cold}")
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    # Fake servers on a data dir of its own.
    fake_data = os.path.join(scratch, "fake")
    os.mkdir(fake_data, 0o700)
    fake_sock = os.path.join(fake_data, "warm.sock")
    echo = ["exec", "--", "echo", "ran here"]
    # Another version: the client runs the command itself.
    server = fake_server(fake_sock, b"v\0\0\0\0")
    out = run(echo, data=fake_data)
    if not fake_answered(server, fake_sock) or (out.returncode, out.stdout) != (0, b"ran here\n"):
        fail(f"a server of another version: {out}")
    # A server that goes away before the exit status.
    server = fake_server(fake_sock, b"o" + struct.pack("<I", 4) + b"half")
    out = run(echo, data=fake_data)
    fake_answered(server, fake_sock)
    went = (f"skillbox exec: skillbox warm (at {fake_sock}) went away before the command "
            f"ended\n").encode()
    if (out.returncode, out.stdout, out.stderr) != (125, b"half", went):
        fail(f"a server that went away: {out}")
    # A server of another user, or of this uid in another user namespace (code in a
    # sandbox), is not told the command: the client runs it itself.
    if os.geteuid() == 0:
        os.chmod(fake_data, 0o711)
        for label, prefix in [
            ("another user", ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]),
            ("another user namespace", ["unshare", "--user", "--map-root-user"]),
        ]:
            server = fake_server(fake_sock, b"x\x01\0\0\0\0", prefix)
            out = run(echo, data=fake_data)
            if fake_answered(server, fake_sock) or (out.returncode, out.stdout) != (0, b"ran here\n"):
                fail(f"a server of {label}: {out}")
        # The same, with the client in a pid namespace of its own and the host's /proc
        # (SO_PEERCRED numbers the peer in the client's namespace, /proc in another):
        # the peer the client checks must be the one it talks to.
        driver = (
            "import socket, subprocess, sys\n"
            "listener = socket.socket(socket.AF_UNIX); listener.bind(sys.argv[1])\n"
            "fake = subprocess.Popen(['unshare', '--user', '--map-root-user', 'python3', '-c',"
            " sys.argv[2], str(listener.fileno()), sys.argv[3]],"
            " pass_fds=[listener.fileno()], stdout=subprocess.PIPE)\n"
            "listener.close(); fake.stdout.readline()\n"
            "out = subprocess.run(sys.argv[4:], capture_output=True)\n"
            "fake.wait(timeout=60)\n"
            "print(fake.returncode, out.returncode, repr(out.stdout))\n")
        out = subprocess.run(
            ["unshare", "--pid", "--fork", "python3", "-c", driver, fake_sock, SERVE_ONCE,
             b"x\x01\0\0\0\0".hex(), BINARY, "--data-dir", fake_data, *echo],
            capture_output=True, timeout=120)
        os.unlink(fake_sock)
        # (The full client it falls back to may not make a sandbox there; what
        # matters is that the fake server was told nothing: it exits 3.)
        if out.stdout.split()[:1] != [b"3"]:
            fail(f"a server of another user namespace, seen from a pid namespace: {out}")
        os.chmod(fake_data, 0o700)
    subprocess.run(["rm", "-rf", scratch], check=True)
    print("check_warm_client: the entry point's client answers as exec does, every path")


if __name__ == "__main__":
    main()
