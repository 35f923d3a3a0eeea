"""The `mcp` package's client (PyPI) against a real `skillbox serve` at /mcp, over
streamable HTTP, behind its API keys.

Usage: over_http.py BASE_URL ALICE_TOKEN BOB_TOKEN DECK_SCRIPT OUT_PPTX
The server has keys for the tenants alice and bob, and serves examples/capabilities
with fmt-json granted (word-count is not). Prints `ok` and exits 0 when every check
passed; an assertion names what did not.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import anyio
import httpx2
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client

from checks import (
    TOOLS,
    check_bad_input,
    check_exec_progress,
    check_session_files,
    check_tools,
    expect_tool_error,
    make_deck,
)

ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def rpc(method: str, params: dict | None = None, id: int | None = 1) -> dict:
    message: dict = {"jsonrpc": "2.0", "method": method}
    if id is not None:
        message["id"] = id
    if params is not None:
        message["params"] = params
    return message


def answer_of(response: httpx2.Response) -> dict:
    """The JSON-RPC answer of a POST, whether it came as JSON or as an SSE stream."""
    if response.headers.get("content-type", "").startswith("application/json"):
        return response.json()
    for line in response.text.splitlines():
        if line.startswith("data:") and line[5:].strip():
            return json.loads(line[5:])
    raise AssertionError(f"no answer in {response.text!r}")


def client_for(base: str, token: str, http: httpx2.AsyncClient) -> Client:
    return Client(streamable_http_client(f"{base}/mcp", http_client=http))


async def open_sandboxes(base: str, token: str) -> int:
    async with httpx2.AsyncClient(headers=bearer(token)) as http:
        metrics = (await http.get(f"{base}/metrics")).text
    [line] = [l for l in metrics.splitlines() if l.startswith("skillbox_mcp_sandboxes_open ")]
    return int(line.split()[1])


async def check_the_door(base: str, alice: str) -> None:
    """/mcp is refused exactly like every other route without a valid key or Host."""
    call = rpc("tools/call", {"name": "exec", "arguments": {"shell": "id"}})
    async with httpx2.AsyncClient() as http:
        for headers in ({}, bearer("sbx_not-a-key-of-this-server")):
            for path in ("/mcp", "/v1/run"):
                refused = await http.post(f"{base}{path}", json=call, headers={**ACCEPT, **headers})
                assert refused.status_code == 401, (path, refused.status_code, refused.text)
                assert refused.headers["www-authenticate"] == "Bearer"
                assert refused.json()["error"]["code"] == "unauthenticated", refused.text
        refused = await http.get(f"{base}/mcp", headers={"Accept": "text/event-stream"})
        assert refused.status_code == 401, refused.text
        foreign = await http.post(
            f"{base}/mcp", json=rpc("initialize"), headers={**ACCEPT, **bearer(alice), "Host": "evil.example"}
        )
        assert foreign.status_code == 403, foreign.text
        assert foreign.json()["error"]["code"] == "permission_denied"


async def check_session_is_its_tenants(base: str, alice: str, bob: str) -> None:
    """An MCP session opened with alice's key does not answer bob's."""
    async with httpx2.AsyncClient() as http:
        init = rpc(
            "initialize",
            {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"},
            },
        )
        opened = await http.post(f"{base}/mcp", json=init, headers={**ACCEPT, **bearer(alice)})
        assert opened.status_code == 200, opened.text
        session = opened.headers["mcp-session-id"]
        assert answer_of(opened)["result"]["serverInfo"]["name"] == "skillbox"
        headers = {**ACCEPT, "Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
        done = await http.post(
            f"{base}/mcp", json=rpc("notifications/initialized", id=None), headers={**headers, **bearer(alice)}
        )
        assert done.status_code == 202, done.text
        theirs = await http.post(f"{base}/mcp", json=rpc("tools/list", id=2), headers={**headers, **bearer(bob)})
        error = answer_of(theirs).get("error")
        assert error and "no such MCP session" in error["message"], theirs.text
        ours = await http.post(f"{base}/mcp", json=rpc("tools/list", id=3), headers={**headers, **bearer(alice)})
        assert {t["name"] for t in answer_of(ours)["result"]["tools"]} >= TOOLS, ours.text
        ended = await http.delete(f"{base}/mcp", headers={**headers, **bearer(alice)})
        assert ended.status_code < 300, ended.text


async def check_capabilities(client) -> None:
    ran = await client.call_tool("run_capability", {"name": "fmt-json", "stdin": '{"b": 1, "a": [2]}'})
    assert not ran.is_error, ran
    assert ran.structured_content["grant"] == "project", ran.structured_content
    assert ran.structured_content["output"]["stdout"] == '{\n  "a": [\n    2\n  ],\n  "b": 1\n}\n'
    expect_tool_error(
        await client.call_tool("run_capability", {"name": "word-count"}),
        "(permission_denied)",
        "skillbox cap --project",
    )
    expect_tool_error(await client.call_tool("run_capability", {"name": "git-report"}), "never runs a host capability")
    expect_tool_error(await client.call_tool("run_capability", {"name": "nope"}), "(not_found)")


async def main(base: str, alice: str, bob: str, deck_script: str, out_pptx: str) -> None:
    await check_the_door(base, alice)
    timeout = httpx2.Timeout(30, read=300)
    async with httpx2.AsyncClient(headers=bearer(alice), timeout=timeout) as http:
        async with client_for(base, alice, http) as client:
            assert client.server_info.name == "skillbox", client.server_info
            await check_tools(client, TOOLS | {"run_capability"})
            uri, deck = await make_deck(client, Path(deck_script).read_text(), out_pptx)
            # Over HTTP a made file also carries its download link, for this tenant only.
            assert deck["url"] == f"/v1/objects/{deck['sha256']}?name=workspacex.pptx", deck
            downloaded = await http.get(f"{base}{deck['url']}")
            assert downloaded.status_code == 200 and downloaded.content == Path(out_pptx).read_bytes()
            await check_session_files(client)
            await check_exec_progress(client)
            await check_bad_input(client)
            await check_capabilities(client)
            assert await open_sandboxes(base, alice) == 1
            async with httpx2.AsyncClient(headers=bearer(bob), timeout=timeout) as theirs:
                async with client_for(base, bob, theirs) as other:
                    try:
                        await other.read_resource(uri)
                        raise AssertionError("bob read alice's deck as a resource")
                    except MCPError as e:
                        assert "no resource" in str(e), e
                    assert (await other.list_resources()).resources == []
                assert (await theirs.get(f"{base}{deck['url']}")).status_code == 404
    await check_session_is_its_tenants(base, alice, bob)
    # alice's client ended its session (DELETE): its sandbox is removed.
    deadline = time.monotonic() + 30
    while await open_sandboxes(base, alice) != 0:
        assert time.monotonic() < deadline, "the session's sandbox was not removed within 30 s"
        await anyio.sleep(0.05)
    print("ok")


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:6])
