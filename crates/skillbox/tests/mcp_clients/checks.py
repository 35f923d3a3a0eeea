"""What both MCP client scripts check, through the `mcp` package's Client (PyPI), never
through anything skillbox wrote. Run by crates/skillbox/tests/mcp.rs."""

from __future__ import annotations

import base64
import io
import re
import time
import zipfile
from pathlib import Path

TOOLS = {"run_script", "exec", "read_file", "write_file", "list_dir", "list_skills"}


def text_of(result) -> str:
    return "\n".join(block.text for block in result.content if getattr(block, "type", "") == "text")


def expect_tool_error(result, *needles: str) -> None:
    assert result.is_error, f"expected a tool error, got {result}"
    message = text_of(result)
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"


def wait_until(what: str, done, seconds: float = 30.0) -> None:
    """Polls `done` until it is true, for at most `seconds`."""
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s"
        time.sleep(0.05)


async def check_tools(client, expected: set[str] = TOOLS) -> None:
    listed = await client.list_tools()
    names = {tool.name for tool in listed.tools}
    assert names == expected, names
    for tool in listed.tools:
        schema = tool.input_schema
        assert schema["type"] == "object", (tool.name, schema)
        assert schema.get("additionalProperties") is False, (tool.name, schema)
    run = next(tool for tool in listed.tools if tool.name == "run_script")
    assert run.input_schema["required"] == ["language", "script"], run.input_schema
    assert "description" in run.model_dump() and run.description


async def make_deck(client, deck_script: str, out_path: str) -> tuple[str, dict]:
    """Runs the pptxgenjs example, reads the deck back as a resource, checks it is a zip
    with three slides and writes it to out_path (the Rust side verifies it again)."""
    result = await client.call_tool("run_script", {"language": "node", "script": deck_script})
    assert not result.is_error, text_of(result)
    ran = result.structured_content
    assert ran["exitCode"] == 0, ran
    assert ran["stdout"] == "wrote workspacex.pptx\n", ran
    [deck] = [f for f in ran["files"] if f["path"] == "workspacex.pptx"]
    assert deck["uri"] == f"skillbox://objects/{deck['sha256']}/workspacex.pptx", deck
    links = [block for block in result.content if block.type == "resource_link"]
    assert [link.uri for link in links] == [deck["uri"]], result.content

    listed = await client.list_resources()
    assert deck["uri"] in {r.uri for r in listed.resources}, listed

    read = await client.read_resource(deck["uri"])
    [contents] = read.contents
    assert contents.mime_type == deck["contentType"], contents.mime_type
    data = base64.b64decode(contents.blob)
    assert len(data) == deck["size"], (len(data), deck["size"])
    with zipfile.ZipFile(io.BytesIO(data)) as pptx:
        slides = sorted(n for n in pptx.namelist() if re.fullmatch(r"ppt/slides/slide\d+\.xml", n))
        assert slides == [f"ppt/slides/slide{i}.xml" for i in (1, 2, 3)], slides
        assert b"WorkspaceX" in pptx.read("ppt/slides/slide1.xml")
    Path(out_path).write_bytes(data)
    return deck["uri"], deck


async def check_session_files(client) -> None:
    """write_file, exec and read_file in the session's one sandbox: what one call leaves,
    the next sees."""
    wrote = await client.call_tool("write_file", {"path": "notes/todo.txt", "content": "first\n"})
    assert not wrote.is_error, text_of(wrote)
    ran = await client.call_tool(
        "exec", {"shell": "cat notes/todo.txt && echo second >> notes/todo.txt && pwd"}
    )
    assert not ran.is_error, text_of(ran)
    assert ran.structured_content["stdout"] == "first\n/workspace\n", ran.structured_content
    read = await client.call_tool("read_file", {"path": "notes/todo.txt"})
    assert not read.is_error, text_of(read)
    assert read.structured_content["content"] == "first\nsecond\n", read.structured_content
    assert text_of(read) == "first\nsecond\n"
    listed = await client.call_tool("list_dir", {"path": "notes"})
    assert listed.structured_content["entries"] == [
        {"name": "todo.txt", "kind": "file", "size": 13}
    ], listed.structured_content
    ran = await client.call_tool("exec", {"command": ["sh", "-c", "read line; echo got $line"], "stdin": "x\n"})
    assert ran.structured_content["stdout"] == "got x\n", ran.structured_content
    # A failed command is a tool error that still says how it ended.
    failed = await client.call_tool("exec", {"shell": "echo oops >&2; exit 3"})
    assert failed.is_error and failed.structured_content["exitCode"] == 3, failed
    assert failed.structured_content["stderr"] == "oops\n"


async def check_exec_progress(client) -> None:
    """An exec called with a progress token reports while it runs (how long, how much
    output, its last line), each report later than the one before; the answer is the
    same as without one. (Whether one comes after the answer cannot be seen here: the
    client drops a call's progress handler when its answer arrives.)"""
    reports = []

    async def on_progress(progress, total, message):
        reports.append((progress, total, message))

    ran = await client.call_tool(
        "exec",
        {"shell": "for i in 1 2 3 4; do echo step $i; sleep 0.4; done"},
        progress_callback=on_progress,
    )
    assert not ran.is_error, text_of(ran)
    assert ran.structured_content["stdout"] == "step 1\nstep 2\nstep 3\nstep 4\n", ran
    assert len(reports) >= 2, reports
    progress = [p for p, _, _ in reports]
    assert all(a < b for a, b in zip(progress, progress[1:])), reports
    assert all(total is None for _, total, _ in reports), reports
    assert any(m and "bytes of output: step " in m for _, _, m in reports), reports
    # A quiet command is reported every 5 s.
    reports.clear()
    quiet = await client.call_tool("exec", {"shell": "sleep 6.5"}, progress_callback=on_progress)
    assert not quiet.is_error, text_of(quiet)
    assert reports and all(m and m.endswith(", 0 bytes of output") for _, _, m in reports), reports


async def check_bad_input(client) -> None:
    """Bad input is a tool error naming what is wrong, never a broken session."""
    expect_tool_error(
        await client.call_tool("run_script", {"script": "echo hi"}), "missing field `language`"
    )
    expect_tool_error(
        await client.call_tool("run_script", {"language": "ruby", "script": "x"}),
        "language: unknown variant `ruby`",
    )
    expect_tool_error(await client.call_tool("run_script", {"language": "sh", "script": " "}), "script: empty")
    expect_tool_error(
        await client.call_tool("exec", {"command": ["ls"], "shell": "ls"}), "exactly one of command"
    )
    expect_tool_error(await client.call_tool("exec", {"comand": ["ls"]}), "unknown field `comand`")
    expect_tool_error(await client.call_tool("read_file", {"path": "../../etc/passwd"}), "without `..`")
    expect_tool_error(await client.call_tool("read_file", {"path": "no/such/file"}), "read_file failed (not_found)")
    expect_tool_error(
        await client.call_tool("exec", {"shell": "true", "backend": "docker"}),
        "this session's sandbox is native",
    )
    # A script that fails is a tool error with its exit code and stderr.
    failed = await client.call_tool("run_script", {"language": "python", "script": "raise SystemExit('boom')"})
    assert failed.is_error, failed
    assert failed.structured_content["exitCode"] == 1 and "boom" in failed.structured_content["stderr"]
    # Still usable afterwards.
    ok = await client.call_tool("exec", {"shell": "echo still here"})
    assert ok.structured_content["stdout"] == "still here\n", ok

