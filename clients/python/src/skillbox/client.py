"""The connection to one `skillbox serve`: sessions, one-shot runs, the server's health."""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from ._http import Transport
from .run import RunResult
from .sandbox import Backend, Sandbox, SessionInfo, _millis

if TYPE_CHECKING:
    from types import TracebackType
    from typing import Self

__all__ = ["Client", "Language"]

Language = Literal["python", "node", "sh"]


class Client:
    """Talks to one server with one API key; safe to share between threads.

    Args:
        url: the server (default ``$SKILLBOX_URL``, else ``http://127.0.0.1:8080``). A
            path after the host (a reverse proxy's prefix) is kept.
        api_key: its API key, sent as ``Authorization: Bearer …`` (default
            ``$SKILLBOX_API_KEY``; none for a server without keys).
        timeout: seconds to wait for any one answer (``None``: no limit). A one-shot
            run waits for its own timeout on top of this; an exec's stream waits as
            long as the command runs.
    """

    def __init__(
        self, url: str | None = None, api_key: str | None = None, *, timeout: float | None = 120.0
    ) -> None:
        self._transport = Transport(url, api_key, timeout)

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def url(self) -> str:
        return self._transport.url

    def close(self) -> None:
        """Closes idle connections (sessions stay open on the server)."""
        self._transport.close()

    def health(self) -> bool:
        """Whether the server answers ``GET /healthz``."""
        return self._transport.call("GET", "/healthz").get("status") == "ok"

    def create_sandbox(
        self,
        *,
        backend: Backend | None = None,
        skills: Iterable[str] = (),
        scope_key: str | None = None,
        idle_timeout: float | None = None,
        max_lifetime: float | None = None,
        exec_timeout: float | None = None,
        memory_bytes: int | None = None,
        pids: int | None = None,
        disk_bytes: int | None = None,
        allow_net: Iterable[str] = (),
        deny_net: Iterable[str] = (),
    ) -> Sandbox:
        """Opens a session; the arguments are :meth:`Sandbox.create`'s."""
        body: dict[str, Any] = {}
        if backend is not None:
            body["backend"] = backend
        if skills := list(skills):
            body["skills"] = skills
        if scope_key is not None:
            body["scopeKey"] = scope_key
        if idle_timeout is not None:
            body["idleTimeoutMs"] = _millis("idle_timeout", idle_timeout)
        if max_lifetime is not None:
            body["maxLifetimeMs"] = _millis("max_lifetime", max_lifetime)
        limits: dict[str, int] = {}
        if exec_timeout is not None:
            limits["timeoutMs"] = _millis("exec_timeout", exec_timeout)
        if memory_bytes is not None:
            limits["memoryBytes"] = memory_bytes
        if pids is not None:
            limits["pids"] = pids
        if disk_bytes is not None:
            limits["diskBytes"] = disk_bytes
        if limits:
            body["limits"] = limits
        if network := _network(allow_net, deny_net):
            body["network"] = network
        answer = self._transport.call("POST", "/v1/sessions", json_body=body, ok=(201,))
        return Sandbox(self, SessionInfo._from_wire(answer))

    def sandbox(self, session_id: str) -> Sandbox:
        """A session opened earlier, by id (:class:`NotFound` when it has ended or is
        another tenant's)."""
        return Sandbox(
            self, SessionInfo._from_wire(self._transport.call("GET", f"/v1/sessions/{session_id}"))
        )

    def sandboxes(self) -> list[Sandbox]:
        """This tenant's open sessions, oldest first."""
        answer = self._transport.call("GET", "/v1/sessions")
        return [Sandbox(self, SessionInfo._from_wire(s)) for s in answer.get("sessions", [])]

    def run(
        self,
        script: str,
        *,
        language: Language = "python",
        files: Mapping[str, str | bytes] | None = None,
        timeout: float | None = None,
        outputs: Sequence[str] | None = None,
        backend: Backend | None = None,
        skills: Iterable[str] = (),
        scope_key: str | None = None,
        disk_bytes: int | None = None,
        disk_inodes: int | None = None,
        allow_net: Iterable[str] = (),
        deny_net: Iterable[str] = (),
    ) -> RunResult:
        """Runs `script` once in a fresh sandbox (``POST /v1/run``); the files it makes in
        ``/workspace`` come back as :attr:`RunResult.artifacts`.

        Args:
            script: the program's source.
            language: ``python``, ``node`` or ``sh``.
            files: inputs written to ``/workspace`` first, by relative path (bytes are
                sent as base64). Inputs come back only if the script changes them.
            timeout: seconds before it is killed (the server's default: 60).
            outputs: globs choosing which files come back (default: every visible
                file it made or changed); :meth:`RunResult.download_all` writes what
                they declare into the directory itself.
            backend: ``native`` (default), ``docker``, ``gvisor`` or ``wasm``.
            skills: skills placed in ``/workspace`` first.
            scope_key: start from the scope's last ``/workspace`` and save a new one.
            disk_bytes, disk_inodes: tighter disk bounds than the server's.
            allow_net: hosts the code may reach through skillbox's egress proxy
                (``host``, ``host:port``, ``*.domain``; no port means 80 and 443). Without
                any it has no network at all.
            deny_net: hosts it may never reach, even when ``allow_net`` covers them.

        Raises:
            Overloaded: too many runs at once for the server or this tenant
                (``retry_after`` says when to try again).
            InvalidRequest: a bad argument (the message names the field).
        """
        body: dict[str, Any] = {"script": script, "language": language}
        if timeout is not None:
            body["timeoutMs"] = _millis("timeout", timeout)
        if files:
            inputs = []
            for path, content in files.items():
                if isinstance(content, str):
                    inputs.append({"path": path, "content": content})
                else:
                    inputs.append(
                        {"path": path, "content": base64.b64encode(content).decode(), "encoding": "base64"}
                    )
            body["files"] = inputs
        if backend is not None:
            body["backend"] = backend
        if outputs is not None:
            body["outputs"] = list(outputs)
        if skills := list(skills):
            body["skills"] = skills
        if scope_key is not None:
            body["scopeKey"] = scope_key
        limits: dict[str, int] = {}
        if disk_bytes is not None:
            limits["diskBytes"] = disk_bytes
        if disk_inodes is not None:
            limits["diskInodes"] = disk_inodes
        if limits:
            body["limits"] = limits
        if network := _network(allow_net, deny_net):
            body["network"] = network
        # The answer comes when the script has ended: wait for its timeout too (60 s
        # when the server chooses).
        base = self._transport.timeout
        wait = None if base is None else base + (timeout if timeout is not None else 60.0)
        answer = self._transport.open("POST", "/v1/run", json_body=body, timeout=wait, ok=(200,)).json()
        return RunResult._from_wire(self._transport, answer, tuple(outputs or ()))


def _network(allow: Iterable[str], deny: Iterable[str]) -> dict[str, list[str]] | None:
    """The ``network`` of a request: ``None`` when nothing is allowed (no network)."""
    allowed, denied = list(allow), list(deny)
    if not allowed:
        if denied:
            raise ValueError("deny_net needs allow_net: without it there is no network to deny")
        return None
    network = {"allow": allowed}
    if denied:
        network["deny"] = denied
    return network
