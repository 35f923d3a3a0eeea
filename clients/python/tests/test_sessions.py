"""Sessions through the client against a real `skillbox serve`: open one, write a file,
stream a command's output line by line while it runs, cancel a long command with
nothing left running, read a produced file back, delete it; the idle reaper; the errors.
"""

from __future__ import annotations

import os

import pytest
from conftest import Server, host_processes, wait_until

from skillbox import (
    AuthenticationError,
    Client,
    CommandFailed,
    Exit,
    InvalidRequest,
    Line,
    NotFound,
    Output,
    Overloaded,
    Sandbox,
)


def test_a_session_streams_cancels_reads_and_is_deleted(server: Server) -> None:
    with Sandbox.create(server.url, server.keys["ana"], idle_timeout=120) as sandbox:
        assert sandbox.id.startswith("ses_")
        assert sandbox.backend == "native"
        assert sandbox.files.write("in/name.txt", "skillbox") == 8

        # The command says hello and "ready", then waits for a file the test writes only
        # after it has read "ready": the lines stream while it runs, or this never ends.
        run = sandbox.exec(
            shell='echo "hello $(cat in/name.txt)"; echo ready; '
            "while [ ! -e go ]; do sleep 0.05; done; echo done > out.txt; echo finished >&2",
            timeout=60,
        )
        assert run.id.startswith("exe_")
        seen: list[Line] = []
        for line in run.lines():
            seen.append(line)
            if line.text == "ready":
                assert run.exit is None, "the command ended before the test let it"
                sandbox.files.write("go", b"")
        assert seen == [
            Line("stdout", "hello skillbox"),
            Line("stdout", "ready"),
            Line("stderr", "finished"),
        ]
        result = run.wait()
        assert result.ok and result.exit_code == 0 and not result.cancelled
        assert result.stdout == "hello skillbox\nready\n"
        assert result.stderr == "finished\n"

        # What it made is read back, and listed.
        assert sandbox.files.read_text("out.txt") == "done\n"
        assert sandbox.files.read("/workspace/out.txt") == b"done\n"
        entries = {e.name: e for e in sandbox.files.list()}
        assert sorted(entries) == ["go", "in", "out.txt"]
        assert entries["in"].is_dir and entries["out.txt"].size == 5
        assert [e.name for e in sandbox.files.list("in")] == ["name.txt"]

        # A long command, cancelled: its whole process tree dies, the session goes on.
        marker = str(970_000_000 + os.getpid())
        long = sandbox.exec(f"sleep {marker} & sleep {marker}; echo never")
        wait_until("the long command's two sleeps start", lambda: len(host_processes("sleep", marker)) == 2)
        assert long.cancel()
        ended = long.wait()
        assert ended.cancelled and ended.exit_code is None and ended.signal == 9
        assert "never" not in ended.stdout
        wait_until(
            "every process of the cancelled command is gone", lambda: not host_processes("sleep", marker)
        )
        assert not long.cancel(), "a second cancel has nothing to cancel"
        assert sandbox.exec(["cat", "out.txt"]).wait().stdout == "done\n"

        sandbox.files.remove("go")
        sandbox.files.remove("in", recursive=True)
        assert [e.name for e in sandbox.files.list()] == ["out.txt"]
        assert not sandbox.files.exists("go") and sandbox.files.exists("out.txt")
        session_id = sandbox.id

    # Leaving the block deleted it.
    with server.client() as client:
        with pytest.raises(NotFound) as gone:
            client.sandbox(session_id)
        assert gone.value.code == "not_found" and gone.value.status == 404
        assert session_id not in [s.id for s in client.sandboxes()]
    assert sandbox.delete() is None, "deleting twice is harmless"


def test_closing_the_stream_cancels_the_command(client: Client) -> None:
    marker = str(971_000_000 + os.getpid())
    with client.create_sandbox() as sandbox:
        with sandbox.exec(["sh", "-c", f"sleep {marker} & sleep {marker}"]) as run:
            wait_until("the command starts", lambda: len(host_processes("sleep", marker)) == 2)
        # The client went away: the server cancelled the exec, its children with it.
        wait_until("the abandoned command is gone", lambda: not host_processes("sleep", marker))
        wait_until("the session counts no exec running", lambda: sandbox.refresh().execs_running == 0)
        assert run.exit is None


def test_events_stdin_cwd_env_and_exit_codes(client: Client) -> None:
    with client.create_sandbox(exec_timeout=30) as sandbox:
        events = list(sandbox.exec(["sh", "-c", "cat; echo err >&2; exit 3"], stdin=b"\x00bytes\n"))
        assert isinstance(events[-1], Exit) and events[-1].exit_code == 3
        assert Output("stderr", "err\n") in events
        assert (
            "".join(e.data for e in events if isinstance(e, Output) and e.stream == "stdout") == "\x00bytes\n"
        )

        sandbox.files.write("sub/dir/run.sh", '#!/bin/sh\necho "$PWD $GREETING"\n', executable=True)
        result = sandbox.exec(["./run.sh"], cwd="sub/dir", env={"GREETING": "hi"}).wait()
        assert result.check().stdout == "/workspace/sub/dir hi\n"
        assert sandbox.exec("wc -c", stdin="héllo").wait().stdout.strip() == "6"

        failed = sandbox.exec("echo broken >&2; exit 2").wait()
        assert not failed.ok and failed.exit_code == 2
        with pytest.raises(CommandFailed, match="exited 2: broken") as raised:
            failed.check()
        assert raised.value.result is failed

        slow = sandbox.exec(["sleep", "30"], timeout=0.5).wait()
        assert slow.timed_out and not slow.ok

        with pytest.raises(ValueError):
            sandbox.exec(["true"], shell="true")
        with pytest.raises(InvalidRequest) as bad:
            sandbox.exec(["true"], cwd="../..")
        assert bad.value.code == "invalid" and "cwd" in bad.value.message


def test_an_abandoned_session_is_reaped(client: Client) -> None:
    sandbox = client.create_sandbox(idle_timeout=0.3)
    assert sandbox.info.idle_timeout_ms == 300
    # The reaper looks every 2 s; refresh() does not count as use.
    wait_until("the idle session is reaped", lambda: not sandbox.is_alive())
    with pytest.raises(NotFound):
        sandbox.exec(["true"])
    with pytest.raises(NotFound):
        sandbox.files.read("anything")
    assert sandbox.delete() is None


def test_files_outside_the_workspace_and_other_tenants_are_refused(server: Server) -> None:
    with server.client("ana") as ana, server.client("bob") as bob, ana.create_sandbox() as sandbox:
        sandbox.files.write("secret.txt", "ana's")
        with pytest.raises(InvalidRequest) as out:
            sandbox.files.read("../../etc/passwd")
        assert out.value.status == 400
        with pytest.raises(NotFound):
            sandbox.files.read("missing.txt")
        # Bob sees nothing of it, exactly as if it were not there.
        with pytest.raises(NotFound):
            bob.sandbox(sandbox.id)
        assert sandbox.id not in [s.id for s in bob.sandboxes()]
        with pytest.raises(NotFound):
            Sandbox(bob, sandbox.info).files.read("secret.txt")


def test_a_wrong_key_is_refused(server: Server) -> None:
    for key in ("sbx_" + "0" * 64, ""):
        with pytest.raises(AuthenticationError) as refused:
            Sandbox.create(server.url, key)
        assert refused.value.code == "unauthenticated" and refused.value.status == 401
        assert refused.value.message
        with pytest.raises(AuthenticationError):
            Client(server.url, key).run("print(1)")


def test_the_tenant_bound_is_a_distinct_error(server: Server) -> None:
    with server.client("carol") as carol:
        opened = [carol.create_sandbox() for _ in range(8)]
        try:
            with pytest.raises(Overloaded) as full:
                carol.create_sandbox()
            assert full.value.status == 429 and full.value.code == "overloaded"
            assert "carol" in full.value.message
            assert full.value.retry_after is not None and full.value.retry_after >= 1
        finally:
            for sandbox in opened:
                sandbox.delete()
        with carol.create_sandbox() as again:
            assert again.is_alive()


def test_configuration_from_the_environment(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKILLBOX_URL", server.url)
    monkeypatch.setenv("SKILLBOX_API_KEY", server.keys["bob"])
    with Sandbox.create() as sandbox:
        assert sandbox.client.url == server.url
        with Client() as bob:
            assert [s.id for s in bob.sandboxes()] == [sandbox.id]
        assert Sandbox.connect(sandbox.id).id == sandbox.id
