"""The `mcp` package's client (PyPI) against `skillbox mcp` on stdio.

Usage: over_stdio.py SKILLBOX DATA_DIR DECK_SCRIPT OUT_PPTX
Prints `ok` and exits 0 when every check passed; an assertion names what did not.
The server's log (stderr) goes to OUT_PPTX's directory as skillbox-mcp.log.
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from checks import (
    check_bad_input,
    check_exec_progress,
    check_session_files,
    check_tools,
    make_deck,
    wait_until,
)


def count(log: Path, *needles: str) -> int:
    """Lines of the server's log that hold every needle."""
    return sum(all(n in line for n in needles) for line in log.read_text().splitlines())


async def main(skillbox: str, data_dir: str, deck_script: str, out_pptx: str) -> None:
    log = Path(out_pptx).with_name("skillbox-mcp.log")
    server = StdioServerParameters(
        command=skillbox,
        args=["--data-dir", data_dir, "mcp"],
        env={"SKILLBOX_LOG": "warn,skillbox_mcp=info"},
    )
    with log.open("w") as errlog:
        async with Client(stdio_client(server, errlog=errlog)) as client:
            assert client.server_info.name == "skillbox", client.server_info
            await check_tools(client)
            await make_deck(client, Path(deck_script).read_text(), out_pptx)
            # A one-shot run is no session sandbox; the session has none before its
            # first exec or file call.
            assert count(log, "mcp: sandbox opened") == 0, log.read_text()
            await check_session_files(client)
            await check_exec_progress(client)
            await check_bad_input(client)
            # Every call of the session ran in its one sandbox.
            assert count(log, "mcp: sandbox opened") == 1, log.read_text()
            assert count(log, "mcp: sandbox removed") == 0, log.read_text()
    # The client closed stdin: the session ended, and its sandbox was removed.
    wait_until(
        "the session's sandbox removed",
        lambda: count(log, "mcp: sandbox removed", "its MCP session ended") == 1,
    )
    print("ok")


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:5])
