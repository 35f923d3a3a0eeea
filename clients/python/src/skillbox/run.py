"""One-shot runs (``POST /v1/run``): a script in a fresh sandbox, its files kept as
artifacts in the server's store and downloaded from there.
"""

from __future__ import annotations

import hashlib
import os
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._outdir import OutDir
from .errors import IntegrityError
from .exec import Truncated

if TYPE_CHECKING:
    from ._http import Response, Transport

__all__ = ["Artifact", "RunResult"]


@dataclass(frozen=True, slots=True)
class Artifact:
    """A file a run made (or changed), stored by the server under its sha256.

    Attributes:
        path: where the run left it, relative to ``/workspace`` (``out/report.pdf``).
        size: its bytes.
        sha256: its content hash, checked on every whole download.
        content_type: the type the server stored with it (from its extension).
        url: where the server serves it (``/v1/objects/{sha256}?name=…``), relative to
            the server.
    """

    path: str
    size: int
    sha256: str
    content_type: str
    url: str
    _transport: Transport = field(repr=False, compare=False)

    def _open(self) -> Response:
        parts = urllib.parse.urlsplit(self.url)
        query = dict(urllib.parse.parse_qsl(parts.query))
        return self._transport.open("GET", parts.path, query=query or None, ok=(200,))

    def read(self) -> bytes:
        """Its bytes, checked against :attr:`sha256`."""
        data = self._open().read()
        digest = hashlib.sha256(data).hexdigest()
        if digest != self.sha256:
            raise IntegrityError(
                "data_loss", f"{self.path}: downloaded bytes hash to {digest}, not {self.sha256}"
            )
        return data

    def text(self, encoding: str = "utf-8") -> str:
        """Its content as text."""
        return self.read().decode(encoding)

    def download(
        self, directory: str | os.PathLike[str], *, name: str | None = None, overwrite: bool = False
    ) -> Path:
        """Writes it under `directory` at its own relative :attr:`path` (or at `name`),
        making the directories it needs, and returns where.

        The rules of ``skillbox run --out`` hold (docs/design.md §6.4): every entry is made
        beneath the directory without following a symlink, an existing file is kept
        unless `overwrite` (``FileExistsError``), and a name a host tool would act on
        (``.git``, ``HEAD``, ``__pycache__``, ``*.pyc``, a leading ``-``) is never written
        (``PermissionError``). The bytes are streamed to a hidden temporary file beside
        it, checked against :attr:`sha256`, and only then given their name.
        """
        with OutDir(directory, overwrite=overwrite) as out:
            return self._write(out, name if name is not None else self.path, declared=True)

    def _write(self, out: OutDir, relative: str, *, declared: bool) -> Path:
        return out.write(relative, self._open().chunks(), declared=declared, sha256=self.sha256)

    @classmethod
    def _from_wire(cls, transport: Transport, value: dict[str, Any]) -> Artifact:
        return cls(
            path=str(value["path"]),
            size=int(value["size"]),
            sha256=str(value["sha256"]),
            content_type=str(value.get("contentType", "application/octet-stream")),
            url=str(value["url"]),
            _transport=transport,
        )


@dataclass(frozen=True, slots=True)
class EgressConnection:
    """One connection the code asked skillbox's egress proxy for (a run or session
    with ``allow_net``): ``verdict`` is ``allowed`` or ``refused``, ``reason`` why it
    was refused or cut."""

    host: str
    port: int
    verdict: str
    reason: str | None
    address: str | None
    bytes_out: int
    bytes_in: int

    @classmethod
    def _from_wire(cls, value: dict[str, Any]) -> EgressConnection:
        return cls(
            host=str(value["host"]),
            port=int(value["port"]),
            verdict=str(value["verdict"]),
            reason=value.get("reason"),
            address=value.get("address"),
            bytes_out=int(value.get("bytesOut") or 0),
            bytes_in=int(value.get("bytesIn") or 0),
        )


@dataclass(frozen=True, slots=True)
class RunResult:
    """What a one-shot run did: how the script ended, its output, and its artifacts.

    A run that timed out or hit a limit is a result (``timed_out``, ``limit_hit``), not an
    error. ``skills`` and ``snapshot`` are the server's reports (as JSON objects) when the
    run placed skills or had a ``scope_key``.
    """

    exit_code: int | None
    signal: int | None
    stdout: str
    stderr: str
    timed_out: bool
    limit_hit: str | None
    duration_ms: int
    truncated: Truncated
    artifacts: list[Artifact]
    skills: dict[str, Any] | None = None
    snapshot: dict[str, Any] | None = None
    egress: list[EgressConnection] = field(default_factory=list)
    #: The run's ``outputs`` globs: what its caller declared it wants.
    outputs: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """The script exited 0 on its own."""
        return self.exit_code == 0 and not self.timed_out and self.limit_hit is None

    def artifact(self, path: str) -> Artifact:
        """The artifact at `path` (relative to ``/workspace``); ``KeyError`` naming those
        there are when there is none."""
        for artifact in self.artifacts:
            if artifact.path == path:
                return artifact
        raise KeyError(f"{path}: not an artifact of this run (it made {[a.path for a in self.artifacts]})")

    def download_all(self, directory: str | os.PathLike[str], *, overwrite: bool = False) -> list[Path]:
        """Downloads every artifact beneath `directory`, each at its own path, and returns
        where each went.

        As ``skillbox run --out``: when the run declared ``outputs``, the files land in
        `directory` itself; otherwise they go into a new directory of their own beneath
        it (``run-1a2b3c4d/``), never merged into what is there. The rules of
        :meth:`Artifact.download` hold for each file; one file refused does not stop
        the others, and the refusals are raised together at the end as an
        ``ExceptionGroup`` (``except* FileExistsError``).
        """
        written: list[Path] = []
        failed: list[Exception] = []
        with OutDir(directory, overwrite=overwrite) as out:
            for artifact in self.artifacts:
                try:
                    written.append(artifact._write(out, artifact.path, declared=bool(self.outputs)))
                except (OSError, ValueError, IntegrityError) as e:
                    failed.append(e)
        if failed:
            raise ExceptionGroup(
                f"{len(failed)} of {len(self.artifacts)} artifacts not written to {directory}", failed
            )
        return written

    @classmethod
    def _from_wire(
        cls, transport: Transport, value: dict[str, Any], outputs: tuple[str, ...] = ()
    ) -> RunResult:
        truncated = value.get("truncated") or {}
        return cls(
            exit_code=value.get("exitCode"),
            signal=value.get("signal"),
            stdout=str(value.get("stdout", "")),
            stderr=str(value.get("stderr", "")),
            timed_out=bool(value.get("timedOut")),
            limit_hit=value.get("limitHit"),
            duration_ms=int(value.get("durationMs") or 0),
            truncated=Truncated(bool(truncated.get("stdout")), bool(truncated.get("stderr"))),
            artifacts=[Artifact._from_wire(transport, f) for f in value.get("files") or []],
            skills=value.get("skills"),
            snapshot=value.get("snapshot"),
            egress=[EgressConnection._from_wire(c) for c in value.get("egress") or []],
            outputs=outputs,
        )
