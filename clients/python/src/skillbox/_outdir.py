"""Writing a run's files into a directory on this machine: the client's copy-out door,
with the rules of ``skillbox run --out`` (docs/design.md §6.4).

- What the caller declared (a run's ``outputs`` globs, an artifact it picked) lands in
  the directory itself; the rest goes into a new directory of its own beneath it
  (``run-1a2b3c4d``), never merged into what is there.
- Never a name a host tool acts on, declared or not: no ``.git``, no ``HEAD`` (git opens
  a directory holding ``HEAD``, ``objects/`` and ``refs/`` as a repository and runs its
  config's commands), no ``objects``/``refs`` made beside a ``HEAD`` already there, no
  ``__pycache__`` or ``*.pyc``/``*.pyo``, no name that starts with ``-``.
- Every entry is created beneath the directory's fd one component at a time, never
  through a symlink (``O_NOFOLLOW``); an existing file is kept unless ``overwrite``,
  which replaces the entry itself, never what a link points to; files 0644, directories
  0755; a file is written under a hidden temp name and only given its own once whole.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

from .errors import IntegrityError

__all__ = ["OutDir", "never_written"]

_NAME_MAX = 255
_PATH_MAX = 4096


def never_written(parts: tuple[str, ...]) -> str | None:
    """Why a file at `parts` is never written to a host directory, or ``None``."""
    for part in parts:
        lower = part.lower()
        if lower == ".git":
            return "git takes a .git for a repository's own files"
        if lower == "head":
            return (
                "a HEAD beside objects/ and refs/ makes git open its directory as a repository "
                "and run its config's commands"
            )
        if lower == "__pycache__":
            return "Python runs the bytecode it finds in __pycache__"
        if part.startswith("-"):
            return "a command given * in that directory would read the name as an option"
    if parts and parts[-1].lower().endswith((".pyc", ".pyo")):
        return "Python runs bytecode it finds beside a module"
    return None


def _parts(relative: str) -> tuple[str, ...]:
    """The components of a plain relative path, or ``ValueError`` naming why not."""
    if not relative or "\0" in relative or relative.startswith("/") or len(relative) > _PATH_MAX:
        raise ValueError(f"{relative!r}: an artifact is written only below the directory given")
    parts = tuple(relative.split("/"))
    for part in parts:
        if part in ("", ".", ".."):
            raise ValueError(f"{relative!r}: an artifact is written only below the directory given")
        if len(part.encode()) > _NAME_MAX:
            raise ValueError(f"{relative!r}: a name is at most {_NAME_MAX} bytes")
    return parts


class OutDir:
    """A directory on this machine, opened once; files are written beneath its fd."""

    def __init__(
        self, directory: str | os.PathLike[str], *, overwrite: bool, own_dir_prefix: str = "run"
    ) -> None:
        self.path = Path(directory)
        # The caller named it: made if missing; everything beneath it is checked.
        self.path.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._overwrite = overwrite
        self._prefix = own_dir_prefix
        self._own: tuple[int, Path] | None = None

    def close(self) -> None:
        for fd in (self._fd, self._own[0] if self._own else None):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def __enter__(self) -> OutDir:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @property
    def own_dir(self) -> Path | None:
        """The directory of their own that undeclared files went into, once one did."""
        return self._own[1] if self._own else None

    def _own_dir(self) -> tuple[int, Path]:
        if self._own is None:
            for _ in range(8):
                name = f"{self._prefix}-{secrets.token_hex(4)}"
                try:
                    os.mkdir(name, 0o755, dir_fd=self._fd)
                except FileExistsError:
                    continue
                fd = os.open(
                    name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._fd
                )
                self._own = (fd, self.path / name)
                break
            else:
                raise FileExistsError(f"{self.path}: every name tried for the run's own directory was taken")
        return self._own

    def write(
        self, relative: str, chunks: Iterable[bytes], *, declared: bool, sha256: str | None = None
    ) -> Path:
        """Writes `chunks` as `relative`: in the directory itself when `declared`, else in
        the run's own directory. With `sha256`, the bytes are checked before the file
        gets its name (``ValueError`` when they differ). Returns where it is."""
        parts = _parts(relative)
        why = never_written(parts)
        if why is not None:
            raise PermissionError(errno.EACCES, f"{relative}: never written to a host directory: {why}")
        top, base = (self._fd, self.path) if declared else self._own_dir()
        target = base.joinpath(*parts)
        parent = _open_parent(top, base, parts[:-1])
        try:
            _place(parent, parts[-1], chunks, target, self._overwrite, sha256)
        finally:
            if parent != top:
                os.close(parent)
        return target


def _open_parent(top: int, base: Path, dirs: tuple[str, ...]) -> int:
    """Opens (making, 0755) each of `dirs` beneath `top`, refusing a symlink or a file in
    the way and an ``objects``/``refs`` beside a ``HEAD``."""
    current = top
    try:
        for depth, name in enumerate(dirs):
            shown = base.joinpath(*dirs[: depth + 1])
            if name.lower() in ("objects", "refs"):
                try:
                    os.stat("HEAD", dir_fd=current, follow_symlinks=False)
                except FileNotFoundError:
                    pass
                else:
                    raise PermissionError(
                        errno.EACCES,
                        f"{shown}: not made beside a HEAD, where git would open the directory "
                        "as a repository",
                    )
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o755, dir_fd=current)
            try:
                fd = os.open(
                    name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=current
                )
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR) and _is(name, current, stat.S_ISLNK):
                    raise PermissionError(
                        errno.EACCES, f"{shown}: is a symlink; skillbox does not write through links"
                    ) from None
                raise
            if current != top:
                os.close(current)
            current = fd
    except BaseException:
        if current != top:
            os.close(current)
        raise
    return current


def _place(
    parent: int, name: str, chunks: Iterable[bytes], target: Path, overwrite: bool, sha256: str | None
) -> None:
    temp = f".skillbox-partial-{secrets.token_hex(12)}"
    fd = os.open(
        temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=parent
    )
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                digest.update(chunk)
                out.write(chunk)
        if sha256 is not None and digest.hexdigest() != sha256:
            raise IntegrityError(
                "data_loss", f"{target}: downloaded bytes hash to {digest.hexdigest()}, not {sha256}"
            )
        if overwrite:
            if _is(name, parent, stat.S_ISDIR):
                raise IsADirectoryError(errno.EISDIR, f"{target} is a directory; not replaced")
            os.rename(temp, name, src_dir_fd=parent, dst_dir_fd=parent)
        else:
            try:
                os.link(temp, name, src_dir_fd=parent, dst_dir_fd=parent, follow_symlinks=False)
            except FileExistsError:
                raise FileExistsError(
                    errno.EEXIST, f"{target} exists; not overwritten (pass overwrite=True to replace it)"
                ) from None
            os.unlink(temp, dir_fd=parent)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=parent)
        raise


def _is(name: str, dir_fd: int, kind: Callable[[int], bool]) -> bool:
    """Whether the entry `name` beneath `dir_fd` (not followed) is of `kind`."""
    try:
        return kind(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return False
