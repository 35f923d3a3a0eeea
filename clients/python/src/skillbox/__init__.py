"""skillbox: a Python client for `skillbox serve`, the sandbox server for code that AI
agents write.

Open a session, write files, stream a command's output, read back what it made::

    from skillbox import Sandbox

    with Sandbox.create(url="http://127.0.0.1:8080", api_key="sbx_…") as sandbox:
        sandbox.files.write("hello.py", "print('hello')")
        for line in sandbox.exec(["python3", "hello.py"]).lines():
            print(line.text)

Or run a script once and download what it made::

    result = sandbox.run("open('out.txt', 'w').write('hi')", language="python")
    result.artifact("out.txt").download("./out")

``url`` and ``api_key`` default to ``$SKILLBOX_URL`` and ``$SKILLBOX_API_KEY``. Every
error the server answers is a :class:`SkillboxError` carrying its code and message (a
429 is :class:`Overloaded`).
"""

from .client import Client, Language
from .errors import (
    AuthenticationError,
    CommandFailed,
    Conflict,
    ConnectionFailed,
    Gone,
    IntegrityError,
    InvalidRequest,
    NotFound,
    NotSupported,
    Overloaded,
    PayloadTooLarge,
    PermissionDenied,
    QuotaExceeded,
    ResourceExhausted,
    ServerTimeout,
    SkillboxError,
    Unavailable,
)
from .exec import ExecEvent, ExecResult, Execution, Exit, Line, Output, Truncated
from .run import Artifact, EgressConnection, RunResult
from .sandbox import Backend, FileEntry, Files, Sandbox, SessionInfo

__version__ = "0.1.0"

__all__ = [
    "Artifact",
    "AuthenticationError",
    "Backend",
    "Client",
    "CommandFailed",
    "Conflict",
    "ConnectionFailed",
    "EgressConnection",
    "ExecEvent",
    "ExecResult",
    "Execution",
    "Exit",
    "FileEntry",
    "Files",
    "Gone",
    "IntegrityError",
    "InvalidRequest",
    "Language",
    "Line",
    "NotFound",
    "NotSupported",
    "Output",
    "Overloaded",
    "PayloadTooLarge",
    "PermissionDenied",
    "QuotaExceeded",
    "ResourceExhausted",
    "RunResult",
    "Sandbox",
    "ServerTimeout",
    "SessionInfo",
    "SkillboxError",
    "Truncated",
    "Unavailable",
]
