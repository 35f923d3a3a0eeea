"""Exceptions: one class per kind of failure, each carrying the server's error code.

Every error answer of `skillbox serve` is ``{"error": {"code", "message"}}``; the code is
stable (docs/design.md §5.1) and picks the class here, so ``except Overloaded`` catches
a 429 whatever its message says. The message is the server's, which names the field or
the cause and says what to do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .exec import ExecResult

__all__ = [
    "AuthenticationError",
    "CommandFailed",
    "Conflict",
    "ConnectionFailed",
    "IntegrityError",
    "InvalidRequest",
    "NotFound",
    "NotSupported",
    "Overloaded",
    "PayloadTooLarge",
    "PermissionDenied",
    "ResourceExhausted",
    "ServerTimeout",
    "SkillboxError",
    "Unavailable",
    "error_for",
]


class SkillboxError(Exception):
    """Base of every error this package raises.

    Attributes:
        code: the server's error code (``invalid``, ``not_found``, ``overloaded``, …),
            or this client's own for a failure the server did not answer
            (``unavailable`` for a connection that failed).
        message: what failed and what to do, in the server's words.
        status: the HTTP status, or ``None`` when there was no answer (or the error
            came inside a streamed exec).
    """

    code: str
    message: str
    status: int | None

    def __init__(self, code: str, message: str, status: int | None = None) -> None:
        super().__init__(f"{code}: {message}" if status is None else f"{status} {code}: {message}")
        self.code = code
        self.message = message
        self.status = status


class InvalidRequest(SkillboxError):
    """400: a bad field, a bad path (``..``, outside ``/workspace``), bad JSON."""


class AuthenticationError(SkillboxError):
    """401 ``unauthenticated``: no API key, or one the server does not know."""


class PermissionDenied(SkillboxError):
    """403 ``permission_denied``: the server refuses this caller or this thing."""


class NotFound(SkillboxError):
    """404 ``not_found``: no such session (it ended, or it is another tenant's), file,
    exec or object."""


class Conflict(SkillboxError):
    """409 ``already_exists``."""


class PayloadTooLarge(SkillboxError):
    """413 ``payload_too_large``: a body over the server's limit."""


class ResourceExhausted(SkillboxError):
    """422 ``resource_exhausted``: a file or a run's output over a bound."""


class QuotaExceeded(SkillboxError):
    """507 ``quota_exceeded``: what a run made would take the server's artifact store past
    its budget (``--store-budget``); none of it was kept."""


class Gone(SkillboxError):
    """410 ``gone``: what the request names (a session) lived on a server of the cluster
    that is no longer there; it will not come back. Open a new one."""


class Overloaded(SkillboxError):
    """429 ``overloaded``: too many sessions, execs or runs, for this tenant or the server.

    Attributes:
        retry_after: the server's ``Retry-After``, in seconds, when it sent one.
    """

    retry_after: float | None

    def __init__(
        self,
        code: str,
        message: str,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(code, message, status)
        self.retry_after = retry_after


class NotSupported(SkillboxError):
    """501 ``not_supported``: this backend or server cannot do that."""


class Unavailable(SkillboxError):
    """503 ``unavailable`` or ``aborted``: a backend that is not there, a server that
    is stopping."""


class ServerTimeout(SkillboxError):
    """504 ``timeout``: the server did not receive the request body in time."""


class ConnectionFailed(Unavailable):
    """The server could not be reached, or the connection broke before an answer
    (``code`` is ``unavailable``, ``status`` is ``None``)."""


class IntegrityError(SkillboxError):
    """A downloaded artifact's bytes do not match its sha256."""


class CommandFailed(SkillboxError):
    """Raised by :meth:`ExecResult.check` for a command that did not exit 0.

    Attributes:
        result: the command's result, with its output.
    """

    result: ExecResult

    def __init__(self, result: ExecResult) -> None:
        if result.cancelled:
            how = "was cancelled"
        elif result.timed_out:
            how = "timed out"
        elif result.limit_hit is not None:
            how = f"hit its {result.limit_hit} limit"
        elif result.signal is not None:
            how = f"was killed by signal {result.signal}"
        else:
            how = f"exited {result.exit_code}"
        tail = result.stderr[-2000:].rstrip()
        super().__init__("command_failed", f"the command {how}" + (f": {tail}" if tail else ""))
        self.result = result


_BY_CODE: dict[str, type[SkillboxError]] = {
    "invalid": InvalidRequest,
    "not_directory": InvalidRequest,
    "is_directory": InvalidRequest,
    "unauthenticated": AuthenticationError,
    "permission_denied": PermissionDenied,
    "not_found": NotFound,
    "already_exists": Conflict,
    "payload_too_large": PayloadTooLarge,
    "resource_exhausted": ResourceExhausted,
    "overloaded": Overloaded,
    "quota_exceeded": QuotaExceeded,
    "gone": Gone,
    "not_supported": NotSupported,
    "unavailable": Unavailable,
    "aborted": Unavailable,
    "timeout": ServerTimeout,
}

_BY_STATUS: dict[int, type[SkillboxError]] = {
    400: InvalidRequest,
    401: AuthenticationError,
    403: PermissionDenied,
    404: NotFound,
    409: Conflict,
    410: Gone,
    413: PayloadTooLarge,
    422: ResourceExhausted,
    429: Overloaded,
    501: NotSupported,
    503: Unavailable,
    504: ServerTimeout,
    507: QuotaExceeded,
}


def error_for(
    code: str,
    message: str,
    status: int | None = None,
    retry_after: float | None = None,
) -> SkillboxError:
    """The exception for an error the server answered: by its code, else its status."""
    cls = _BY_CODE.get(code) or (_BY_STATUS.get(status) if status is not None else None)
    if cls is Overloaded:
        return Overloaded(code, message, status, retry_after)
    return (cls or SkillboxError)(code, message, status)
