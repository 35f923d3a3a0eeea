"""Sessions: one sandbox kept open across many steps (``/v1/sessions``).

Write files, run commands and read what they made, step after step, in the same
``/workspace``; delete it when done (a ``with`` block does). The server ends a session
left idle past its ``idle_timeout`` or older than its ``max_lifetime``.
"""

from __future__ import annotations

import base64
import builtins
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from .errors import NotFound
from .exec import Execution
from .run import EgressConnection

if TYPE_CHECKING:
    from types import TracebackType
    from typing import Self

    from .client import Client, Language
    from .run import RunResult

__all__ = ["Backend", "FileEntry", "Files", "Sandbox", "SessionInfo"]

Backend = Literal["native", "docker", "gvisor", "wasm"]


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A session as the server describes it.

    Times are milliseconds since the Unix epoch. ``open_ms`` is how long opening it took
    (sandbox, snapshot restore, skills). ``skills`` and ``snapshot`` are the server's
    reports, when it placed skills or has a scope.
    """

    id: str
    backend: str
    created_at_ms: int
    last_used_at_ms: int
    expires_at_ms: int
    idle_timeout_ms: int
    execs_running: int
    open_ms: int
    skills: dict[str, Any] | None = None
    snapshot: dict[str, Any] | None = None
    egress: list[EgressConnection] = field(default_factory=list)

    @classmethod
    def _from_wire(cls, value: dict[str, Any]) -> SessionInfo:
        return cls(
            id=str(value["id"]),
            backend=str(value["backend"]),
            created_at_ms=int(value["createdAtMs"]),
            last_used_at_ms=int(value["lastUsedAtMs"]),
            expires_at_ms=int(value["expiresAtMs"]),
            idle_timeout_ms=int(value["idleTimeoutMs"]),
            execs_running=int(value["execsRunning"]),
            open_ms=int(value["openMs"]),
            skills=value.get("skills"),
            snapshot=value.get("snapshot"),
            egress=[EgressConnection._from_wire(c) for c in value.get("egress") or []],
        )


@dataclass(frozen=True, slots=True)
class FileEntry:
    """One entry of a directory listing. ``kind`` is ``file``, ``dir``, ``symlink`` or
    ``other`` (symlinks are listed, never followed); ``size`` is a file's bytes."""

    name: str
    kind: str
    size: int | None = None

    @property
    def is_dir(self) -> bool:
        return self.kind == "dir"

    @property
    def is_file(self) -> bool:
        return self.kind == "file"


def _file_path(session_id: str, path: str) -> str:
    relative = path.lstrip("/")
    if relative.startswith("workspace/"):
        relative = relative[len("workspace/") :]
    if not relative or relative == "workspace":
        raise ValueError(f"{path!r}: give a file inside /workspace")
    # Each segment is sent as written (`..` included): the server refuses a path out.
    return f"/v1/sessions/{session_id}/files/" + "/".join(
        urllib.parse.quote(p, safe="") for p in relative.split("/")
    )


class Files:
    """The files of a session's ``/workspace``, from :attr:`Sandbox.files`.

    Paths are relative to ``/workspace`` (``/workspace/x`` means the same as ``x``); a
    path with ``..`` is refused by the server (:class:`InvalidRequest`). Everything goes
    through the sandbox itself: no host path is ever touched.
    """

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox

    def read(self, path: str) -> bytes:
        """A regular file's bytes (:class:`NotFound` when it is not there)."""
        return self._sandbox._client._transport.open(
            "GET", _file_path(self._sandbox.id, path), ok=(200,)
        ).read()

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """A regular file's content as text."""
        return self.read(path).decode(encoding)

    def write(self, path: str, data: str | bytes, *, executable: bool = False) -> int:
        """Writes `data` (text as UTF-8) to `path`, making its directories; mode 0755 when
        `executable`, else 0644. Returns the bytes written."""
        body = data.encode() if isinstance(data, str) else bytes(data)
        answer = self._sandbox._client._transport.call(
            "PUT",
            _file_path(self._sandbox.id, path),
            query={"executable": "true"} if executable else None,
            body=body,
            content_type="application/octet-stream",
            ok=(200, 201),
        )
        return int(answer.get("bytes", len(body)))

    def list(self, path: str = "") -> builtins.list[FileEntry]:
        """The entries of a directory (default ``/workspace`` itself), by name."""
        answer = self._sandbox._client._transport.call(
            "GET", f"/v1/sessions/{self._sandbox.id}/ls", query={"path": path} if path else None
        )
        return [FileEntry(str(e["name"]), str(e["kind"]), e.get("size")) for e in answer.get("entries", [])]

    def exists(self, path: str) -> bool:
        """Whether `path` names something, listed in its directory."""
        parent, _, name = path.strip("/").rpartition("/")
        try:
            return any(e.name == name for e in self.list(parent))
        except NotFound:
            return False

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Removes a file, or with `recursive` a directory and all it holds."""
        self._sandbox._client._transport.call(
            "DELETE", _file_path(self._sandbox.id, path), query={"recursive": "true"} if recursive else None
        )


class Sandbox:
    """A session: one sandbox kept open across many steps.

    Open one with :meth:`create` (or :meth:`Client.create_sandbox`), use it as a context
    manager so it is deleted at the end::

        with Sandbox.create(backend="native") as sandbox:
            sandbox.files.write("main.py", "print('hi')")
            print(sandbox.exec(["python3", "main.py"]).wait().stdout)

    Attributes:
        id: the session's id (``ses_…``).
        info: what the server said about it last (:meth:`refresh` asks again).
        files: its ``/workspace`` files (:class:`Files`).
    """

    def __init__(self, client: Client, info: SessionInfo) -> None:
        self._client = client
        self.info = info
        self.id = info.id
        self.files = Files(self)
        self._deleted = False

    def __repr__(self) -> str:
        return f"<Sandbox {self.id} ({self.backend}) at {self._client.url}>"

    @property
    def backend(self) -> str:
        """``native``, ``docker``, ``gvisor`` or ``wasm``."""
        return self.info.backend

    @property
    def client(self) -> Client:
        """The client it talks through."""
        return self._client

    @classmethod
    def create(
        cls,
        url: str | None = None,
        api_key: str | None = None,
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
        timeout: float | None = 120.0,
    ) -> Sandbox:
        """Opens a session.

        Args:
            url: the server (default ``$SKILLBOX_URL``, else ``http://127.0.0.1:8080``).
            api_key: its API key (default ``$SKILLBOX_API_KEY``; none for a server
                without keys).
            backend: ``native`` (the server's default), ``docker``, ``gvisor`` or ``wasm``.
            skills: skills to place in ``/workspace`` first (``GET /v1/skills`` lists
                what this tenant may name).
            scope_key: start from this scope's last ``/workspace``; a new snapshot is
                saved when the session is deleted or reaped.
            idle_timeout: seconds without a call (and nothing running) before the server
                ends it (its default: 600; at most 3600).
            max_lifetime: seconds after which it ends whatever it does (default 3600).
            exec_timeout: each command's default time limit, in seconds.
            memory_bytes, pids, disk_bytes: bounds for the sandbox, at most the server's.
            allow_net: hosts the code may reach through skillbox's egress proxy
                (``host``, ``host:port``, ``*.domain``; no port means 80 and 443). Without
                any it has no network at all.
            deny_net: hosts it may never reach, even when ``allow_net`` covers them.
            timeout: seconds to wait for any one answer of the server (``None``: no limit).

        Raises:
            Overloaded: as many sessions are open as the server or this tenant may have.
            AuthenticationError: the key was missing or wrong.
            InvalidRequest: a bad argument (the message names it).
        """
        from .client import Client

        client = Client(url, api_key, timeout=timeout)
        return client.create_sandbox(
            backend=backend,
            skills=skills,
            scope_key=scope_key,
            idle_timeout=idle_timeout,
            max_lifetime=max_lifetime,
            exec_timeout=exec_timeout,
            memory_bytes=memory_bytes,
            pids=pids,
            disk_bytes=disk_bytes,
            allow_net=allow_net,
            deny_net=deny_net,
        )

    @classmethod
    def connect(cls, session_id: str, url: str | None = None, api_key: str | None = None) -> Sandbox:
        """Attaches to a session opened earlier (:class:`NotFound` when it has ended)."""
        from .client import Client

        return Client(url, api_key).sandbox(session_id)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.delete()

    def refresh(self) -> SessionInfo:
        """Asks the server about it again (:class:`NotFound` once it has ended). This
        does not count as use: it does not keep an idle session alive."""
        self.info = SessionInfo._from_wire(self._client._transport.call("GET", f"/v1/sessions/{self.id}"))
        return self.info

    def is_alive(self) -> bool:
        """Whether the server still has it (it may have been reaped or deleted)."""
        try:
            self.refresh()
        except NotFound:
            return False
        return True

    def delete(self) -> SessionInfo | None:
        """Ends it: running commands cancelled, the scope's snapshot saved, the sandbox
        removed. Returns its last info (with ``snapshot``), or ``None`` when it had
        already ended. Deleting twice is harmless."""
        if self._deleted:
            return None
        try:
            info = SessionInfo._from_wire(self._client._transport.call("DELETE", f"/v1/sessions/{self.id}"))
        except NotFound:
            self._deleted = True
            return None
        self._deleted = True
        self.info = info
        return info

    close = delete

    def exec(
        self,
        command: str | Sequence[str] | None = None,
        *,
        shell: str | None = None,
        stdin: str | bytes | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> Execution:
        """Starts a command and returns as soon as it runs, its output to be read as it
        comes (:class:`Execution`).

        Args:
            command: an argv (``["python3", "main.py"]``, run as is) or a string (a
                script for ``/bin/sh -c``, like `shell`).
            shell: a script for ``/bin/sh -c`` (give this or `command`).
            stdin: fed to its standard input (text as UTF-8); without it, it reads end
                of file at once.
            cwd: its working directory, inside ``/workspace`` (default ``/workspace``).
            env: extra environment variables.
            timeout: seconds before it is killed (``timed_out``); default the session's.

        Example::

            run = sandbox.exec("pip list | head -3")
            for line in run.lines():
                print(line.stream, line.text)
            print(run.wait().exit_code)

        Raises:
            Overloaded: four commands already run in this session.
            NotFound: the session has ended.
        """
        body: dict[str, Any] = {}
        if (command is None) == (shell is None):
            raise ValueError("give exactly one of command (an argv, or a string for sh -c) and shell")
        if shell is not None:
            body["shell"] = shell
        elif isinstance(command, str):
            body["shell"] = command
        else:
            assert command is not None
            argv = list(command)
            if not argv:
                raise ValueError("command: an empty argv")
            body["command"] = argv
        if cwd is not None:
            body["cwd"] = cwd
        if env:
            body["env"] = dict(env)
        if stdin is not None:
            if isinstance(stdin, str):
                body["stdin"] = stdin
            else:
                body["stdin"] = base64.b64encode(stdin).decode()
                body["stdinEncoding"] = "base64"
        if timeout is not None:
            body["timeoutMs"] = _millis("timeout", timeout)
        # A command may be silent for as long as it runs: the stream waits as long as the
        # server lets it (the server ends it at its timeout).
        wait = None if timeout is None else timeout + 60.0
        response = self._client._transport.open(
            "POST", f"/v1/sessions/{self.id}/exec", json_body=body, timeout=wait, ok=(200,)
        )
        return Execution(self._client._transport, self.id, response)

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
        """Runs `script` once in a fresh sandbox of this session's backend
        (``POST /v1/run``) and returns its result, whose artifacts download from the
        server's store.

        This is :meth:`Client.run` with this session's backend: the run does not see this
        session's files, and leaves nothing in it. To run in the session itself, write
        the script with :attr:`files` and :meth:`exec` it.
        """
        return self._client.run(
            script,
            language=language,
            files=files,
            timeout=timeout,
            outputs=outputs,
            backend=backend or _backend(self.backend),
            skills=skills,
            scope_key=scope_key,
            disk_bytes=disk_bytes,
            disk_inodes=disk_inodes,
            allow_net=allow_net,
            deny_net=deny_net,
        )


_BACKENDS: dict[str, Backend] = {"native": "native", "docker": "docker", "gvisor": "gvisor", "wasm": "wasm"}


def _backend(name: str) -> Backend | None:
    return _BACKENDS.get(name)


def _millis(field: str, seconds: float) -> int:
    if seconds <= 0:
        raise ValueError(f"{field}: must be more than 0 seconds")
    return max(1, round(seconds * 1000))
