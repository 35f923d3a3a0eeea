"""What needs no server: the error classes by code and status, paths in URLs, URLs."""

from __future__ import annotations

import pytest

from skillbox import (
    AuthenticationError,
    Client,
    ConnectionFailed,
    Gone,
    InvalidRequest,
    NotFound,
    Overloaded,
    QuotaExceeded,
    SkillboxError,
    Unavailable,
)
from skillbox.errors import error_for
from skillbox.sandbox import _file_path


def test_errors_by_code_then_status() -> None:
    assert type(error_for("invalid", "x", 400)) is InvalidRequest
    assert type(error_for("not_directory", "x", 400)) is InvalidRequest
    assert type(error_for("unauthenticated", "x", 401)) is AuthenticationError
    assert type(error_for("aborted", "x", 503)) is Unavailable
    assert type(error_for("quota_exceeded", "x", 507)) is QuotaExceeded
    assert type(error_for("gone", "x", 410)) is Gone
    assert type(error_for("something_new", "x", 507)) is QuotaExceeded
    overloaded = error_for("overloaded", "too many", 429, retry_after=5.0)
    assert isinstance(overloaded, Overloaded) and overloaded.retry_after == 5.0
    # A code this client does not know yet falls back to the status, then the base.
    assert type(error_for("something_new", "x", 404)) is NotFound
    plain = error_for("something_new", "x", 500)
    assert type(plain) is SkillboxError and plain.code == "something_new" and plain.status == 500
    assert str(plain) == "500 something_new: x"


def test_file_paths_are_relative_to_the_workspace_and_quoted() -> None:
    assert _file_path("ses_1", "a/b c.txt") == "/v1/sessions/ses_1/files/a/b%20c.txt"
    assert _file_path("ses_1", "/workspace/x?y#z") == "/v1/sessions/ses_1/files/x%3Fy%23z"
    # `..` goes to the server as written, which refuses it (400).
    assert _file_path("ses_1", "../etc") == "/v1/sessions/ses_1/files/../etc"
    with pytest.raises(ValueError):
        _file_path("ses_1", "/workspace")


def test_urls_and_an_unreachable_server() -> None:
    with pytest.raises(ValueError):
        Client("ftp://example")
    # Port 9 on loopback: nothing listens there.
    with pytest.raises(ConnectionFailed) as failed:
        Client("http://127.0.0.1:9", timeout=5).health()
    assert failed.value.code == "unavailable" and failed.value.status is None
