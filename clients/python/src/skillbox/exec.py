"""A command running in a session: its output streamed as it comes, then how it ended.

``POST /v1/sessions/{id}/exec`` answers NDJSON, one event a line: ``started`` (with the
exec's id), ``stdout``/``stderr`` chunks as the command writes them, then ``exit`` (or
``error`` when it could not run). :class:`Execution` reads that stream.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from .errors import CommandFailed, ConnectionFailed, NotFound, SkillboxError, error_for

if TYPE_CHECKING:
    from types import TracebackType
    from typing import Self

    from ._http import Response, Transport

__all__ = ["ExecEvent", "ExecResult", "Execution", "Exit", "Line", "Output", "Truncated"]

Stream = Literal["stdout", "stderr"]


@dataclass(frozen=True, slots=True)
class Output:
    """A chunk of a command's output, as it wrote it (UTF-8 text; a character is never
    split between two chunks, but a line may be)."""

    stream: Stream
    data: str


@dataclass(frozen=True, slots=True)
class Truncated:
    """Whether each stream went past the server's output cap (the rest was dropped)."""

    stdout: bool = False
    stderr: bool = False


@dataclass(frozen=True, slots=True)
class Exit:
    """How the command ended.

    Attributes:
        exit_code: its exit status; ``None`` when a signal ended it.
        signal: the signal that ended it (9 for a cancelled or timed-out command).
        timed_out: it ran past its ``timeout``.
        limit_hit: the limit it hit (``memory``, ``pids``, ``disk``, ``output``, …).
        duration_ms: how long it ran.
        truncated: whether its output was cut.
        cancelled: it was cancelled (:meth:`Execution.cancel`, or the session ended).
    """

    exit_code: int | None
    signal: int | None
    timed_out: bool
    limit_hit: str | None
    duration_ms: int
    truncated: Truncated
    cancelled: bool

    @classmethod
    def _from_wire(cls, event: dict[str, Any]) -> Exit:
        truncated = event.get("truncated") or {}
        return cls(
            exit_code=event.get("exitCode"),
            signal=event.get("signal"),
            timed_out=bool(event.get("timedOut")),
            limit_hit=event.get("limitHit"),
            duration_ms=int(event.get("durationMs") or 0),
            truncated=Truncated(bool(truncated.get("stdout")), bool(truncated.get("stderr"))),
            cancelled=bool(event.get("cancelled")),
        )


ExecEvent = Output | Exit
"""What iterating an :class:`Execution` gives: output chunks, then one :class:`Exit`."""


@dataclass(frozen=True, slots=True)
class Line:
    """One line of output (without its newline), from :meth:`Execution.lines`."""

    stream: Stream
    text: str


@dataclass(frozen=True, slots=True)
class ExecResult:
    """A finished command: how it ended and everything it wrote.

    ``stdout`` and ``stderr`` are the whole output (up to the server's cap; see
    ``truncated``).
    """

    exit_code: int | None
    signal: int | None
    timed_out: bool
    limit_hit: str | None
    duration_ms: int
    truncated: Truncated
    cancelled: bool
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        """It exited 0 on its own: no signal, timeout, limit or cancel."""
        return self.exit_code == 0 and not (self.timed_out or self.cancelled or self.limit_hit)

    def check(self) -> ExecResult:
        """This result, or :class:`CommandFailed` when it is not :attr:`ok`."""
        if not self.ok:
            raise CommandFailed(self)
        return self


class Execution:
    """A command running in a session, from :meth:`Sandbox.exec`.

    Iterate it for :class:`Output` chunks as they arrive, ending with one :class:`Exit`;
    or call :meth:`lines` for whole lines, or :meth:`wait` for the result. Everything
    read is also kept in :attr:`stdout` and :attr:`stderr`.

    The command runs as long as this object reads its stream: closing it (:meth:`close`,
    leaving a ``with`` block, or dropping the last reference before the end) cancels
    the command on the server, its whole process tree with it. Keep it until
    :meth:`wait` returns.
    """

    def __init__(self, transport: Transport, session_id: str, response: Response) -> None:
        self._transport = transport
        self._session_id = session_id
        self._response: Response | None = response
        self._chunks = response.chunks()
        self._buffer = b""
        self._stdout: list[str] = []
        self._stderr: list[str] = []
        self._exit: Exit | None = None
        first = self._next_event()
        if first is None or first.get("type") != "started":
            self.close()
            raise SkillboxError("unknown", f"the exec stream did not start with `started`: {first!r}")
        self.id: str = str(first.get("execId", ""))
        """The exec's id (``exe_…``), as the server named it."""

    def __repr__(self) -> str:
        state = "running" if self._exit is None else "ended"
        return f"<Execution {self.id} in {self._session_id} {state}>"

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __del__(self) -> None:
        # The connection goes with the object either way; closing it here only makes
        # that prompt.
        with contextlib.suppress(Exception):
            self.close()

    @property
    def stdout(self) -> str:
        """The standard output read so far."""
        return "".join(self._stdout)

    @property
    def stderr(self) -> str:
        """The standard error read so far."""
        return "".join(self._stderr)

    @property
    def exit(self) -> Exit | None:
        """How it ended, once the stream said so; ``None`` while it runs."""
        return self._exit

    @property
    def done(self) -> bool:
        return self._exit is not None

    def _next_event(self) -> dict[str, Any] | None:
        while b"\n" not in self._buffer:
            chunk = next(self._chunks, None)
            if chunk is None:
                if self._buffer.strip():
                    raise ConnectionFailed(
                        "unavailable", f"the exec stream ended inside a line: {self._buffer[:200]!r}"
                    )
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            event = json.loads(line)
        except ValueError as e:
            raise SkillboxError(
                "unknown", f"the exec stream sent a line that is not JSON: {line[:200]!r}"
            ) from e
        if not isinstance(event, dict):
            raise SkillboxError("unknown", f"the exec stream sent {line[:200]!r}, not an event")
        return event

    def __iter__(self) -> Iterator[ExecEvent]:
        """Output chunks as they come, then the :class:`Exit`. An ``error`` event is
        raised as the exception its code names."""
        while self._exit is None:
            if self._response is None:
                raise ConnectionFailed(
                    "unavailable", f"exec {self.id}: its stream was closed before it ended"
                )
            event = self._next_event()
            if event is None:
                self.close()
                raise ConnectionFailed("unavailable", f"exec {self.id}: the stream ended with no exit event")
            kind = event.get("type")
            if kind in ("stdout", "stderr"):
                data = str(event.get("data", ""))
                (self._stdout if kind == "stdout" else self._stderr).append(data)
                yield Output("stdout" if kind == "stdout" else "stderr", data)
            elif kind == "exit":
                self._exit = Exit._from_wire(event)
                # Read to the end, so the connection can be used again.
                for _ in self._chunks:
                    pass
                self._response = None
                yield self._exit
            elif kind == "error":
                self.close()
                raise error_for(str(event.get("code", "unknown")), str(event.get("message", "")))
            # Unknown event types are for newer clients: skipped.

    def lines(self) -> Iterator[Line]:
        """The output as whole lines, each as soon as its newline arrives (stdout and
        stderr apart; a last line without a newline comes at the end)."""
        pending: dict[Stream, str] = {"stdout": "", "stderr": ""}
        for event in self:
            if isinstance(event, Output):
                text = pending[event.stream] + event.data
                *complete, pending[event.stream] = text.split("\n")
                for line in complete:
                    yield Line(event.stream, line)
        for stream, rest in pending.items():
            if rest:
                yield Line(stream, rest)

    def wait(self) -> ExecResult:
        """Reads to the end and returns the result, with all of the output."""
        for _ in self:
            pass
        end = self._exit
        assert end is not None
        return ExecResult(
            exit_code=end.exit_code,
            signal=end.signal,
            timed_out=end.timed_out,
            limit_hit=end.limit_hit,
            duration_ms=end.duration_ms,
            truncated=end.truncated,
            cancelled=end.cancelled,
            stdout=self.stdout,
            stderr=self.stderr,
        )

    @property
    def result(self) -> ExecResult | None:
        """The result once it ended (without waiting); ``None`` while it runs."""
        return self.wait() if self._exit is not None else None

    def cancel(self) -> bool:
        """Asks the server to kill the command's whole process tree.

        The stream then ends with an :class:`Exit` whose ``cancelled`` is true: keep
        reading (or :meth:`wait`) to see it. Returns ``False`` when the command had
        already ended.
        """
        if self._exit is not None:
            return False
        try:
            self._transport.call("POST", f"/v1/sessions/{self._session_id}/execs/{self.id}/cancel")
        except NotFound:
            return False
        return True

    def close(self) -> None:
        """Stops reading; a command still running is cancelled by the server."""
        response, self._response = self._response, None
        if response is not None:
            response.close()
