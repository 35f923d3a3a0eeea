"""HTTP to `skillbox serve`: keep-alive connections from the standard library, bearer
auth, and the one place an error answer becomes an exception.
"""

from __future__ import annotations

import enum
import http.client
import json
import os
import ssl
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any

from .errors import ConnectionFailed, SkillboxError, error_for

__all__ = ["DEFAULT_URL", "Response", "Transport"]

DEFAULT_URL = "http://127.0.0.1:8080"
_USER_AGENT = "skillbox-python/0.1.0"
# Idle connections kept for reuse. The server closes one after `--header-timeout` (10 s
# by default) without a request; such a stale one is retried once on a fresh one.
_MAX_IDLE = 8

Json = dict[str, Any]


class _Unset(enum.Enum):
    """Marks "the transport's own timeout"."""

    UNSET = enum.auto()


UNSET = _Unset.UNSET


class Response:
    """An answer being read: its status and headers, its body read on demand.

    A response read to its end gives its connection back for reuse; one closed early
    closes its connection (for an exec stream, the server then cancels the exec).
    """

    def __init__(
        self,
        transport: Transport,
        connection: http.client.HTTPConnection,
        raw: http.client.HTTPResponse,
    ) -> None:
        self._transport = transport
        self._connection: http.client.HTTPConnection | None = connection
        self._raw = raw
        self.status = raw.status
        self.headers = raw.headers

    def read(self) -> bytes:
        """The whole remaining body."""
        try:
            data = self._raw.read()
        except (OSError, http.client.HTTPException) as e:
            self.close()
            raise ConnectionFailed("unavailable", f"reading the answer: {e}") from e
        self._release()
        return data

    def chunks(self, size: int = 64 * 1024) -> Iterator[bytes]:
        """The body as it arrives: each chunk as soon as some bytes are there."""
        try:
            while True:
                try:
                    chunk = self._raw.read1(size)
                except (OSError, http.client.HTTPException) as e:
                    raise ConnectionFailed("unavailable", f"reading the answer: {e}") from e
                if not chunk:
                    break
                yield chunk
        except BaseException:
            self.close()
            raise
        self._release()

    def json(self) -> Json:
        body = self.read()
        try:
            value = json.loads(body)
        except ValueError as e:
            raise SkillboxError(
                "unknown", f"the server answered {self.status} with no JSON: {body[:200]!r}", self.status
            ) from e
        if not isinstance(value, dict):
            raise SkillboxError(
                "unknown",
                f"the server answered {self.status} with {type(value).__name__}, not an object",
                self.status,
            )
        return value

    def close(self) -> None:
        """Closes the connection without reading the rest."""
        connection, self._connection = self._connection, None
        if connection is not None:
            self._raw.close()
            connection.close()

    def _release(self) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        if self._raw.isclosed() and not self._raw.will_close:
            self._transport._put_back(connection)
        else:
            self._raw.close()
            connection.close()


class Transport:
    """Requests to one server with one API key. Safe to share between threads."""

    def __init__(self, url: str | None, api_key: str | None, timeout: float | None) -> None:
        url = url or os.environ.get("SKILLBOX_URL") or DEFAULT_URL
        api_key = api_key if api_key is not None else os.environ.get("SKILLBOX_API_KEY")
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url {url!r}: give http://HOST:PORT or https://HOST[:PORT]")
        self.url = url.rstrip("/")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        self._api_key = api_key or None
        self.timeout = timeout
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._ssl: ssl.SSLContext | None = ssl.create_default_context() if self._https else None

    def __repr__(self) -> str:
        return f"Transport({self.url!r}, api_key={'set' if self._api_key else 'none'})"

    def absolute(self, path: str) -> str:
        """The path on the server of `path` (the base URL's own path first)."""
        return self._prefix + path

    def _connect(self, timeout: float | None) -> http.client.HTTPConnection:
        if self._https:
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout, context=self._ssl)
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def _take(self) -> http.client.HTTPConnection | None:
        with self._lock:
            return self._idle.pop() if self._idle else None

    def _put_back(self, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < _MAX_IDLE:
                self._idle.append(connection)
                return
        connection.close()

    def close(self) -> None:
        """Closes the idle connections."""
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    def open(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        json_body: Any = None,
        body: bytes | None = None,
        content_type: str | None = None,
        timeout: float | _Unset | None = UNSET,
        ok: tuple[int, ...] = (200, 201),
    ) -> Response:
        """Sends a request and reads the status line and headers.

        An answer outside `ok` is read and raised as the error its code names.
        `timeout` is the socket's, in seconds (``None`` waits as long as it takes); by
        default the transport's.
        """
        target = urllib.parse.quote(self.absolute(path), safe="/:@!$&'()*+,;=-._~")
        if query:
            target += "?" + urllib.parse.urlencode(query)
        headers = {"User-Agent": _USER_AGENT, "Accept": "application/json, application/x-ndjson"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        payload = body
        if json_body is not None:
            payload = json.dumps(json_body).encode()
            headers["Content-Type"] = "application/json"
        elif content_type is not None:
            headers["Content-Type"] = content_type
        if payload is None and method in ("POST", "PUT"):
            payload = b""
        wait = self.timeout if isinstance(timeout, _Unset) else timeout
        reused = self._take()
        raw: http.client.HTTPResponse | None = None
        if reused is not None:
            raw = self._exchange(reused, method, target, payload, headers, wait, fresh=False)
        connection = reused
        if raw is None:
            connection = self._connect(wait)
            raw = self._exchange(connection, method, target, payload, headers, wait, fresh=True)
        assert raw is not None and connection is not None
        response = Response(self, connection, raw)
        if response.status not in ok:
            raise _error(response)
        return response

    def _exchange(
        self,
        connection: http.client.HTTPConnection,
        method: str,
        target: str,
        payload: bytes | None,
        headers: dict[str, str],
        timeout: float | None,
        *,
        fresh: bool,
    ) -> http.client.HTTPResponse | None:
        """Sends on `connection` and reads the answer's head; ``None`` for a kept
        connection the server had closed (the server closes an idle one only before
        reading a request, so the request is sent again on a new one)."""
        connection.timeout = timeout
        if connection.sock is not None:
            connection.sock.settimeout(timeout)
        try:
            connection.request(method, target, body=payload, headers=headers)
            return connection.getresponse()
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as e:
            connection.close()
            if not fresh:
                return None
            raise ConnectionFailed("unavailable", f"{method} {self.url}{target}: {e}") from e
        except (OSError, http.client.HTTPException) as e:
            connection.close()
            what = "timed out" if isinstance(e, TimeoutError) else str(e) or type(e).__name__
            raise ConnectionFailed("unavailable", f"{method} {self.url}{target}: {what}") from e

    def call(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        json_body: Any = None,
        body: bytes | None = None,
        content_type: str | None = None,
        ok: tuple[int, ...] = (200, 201),
    ) -> Json:
        """A request whose answer is one JSON object."""
        return self.open(
            method, path, query=query, json_body=json_body, body=body, content_type=content_type, ok=ok
        ).json()


def _error(response: Response) -> SkillboxError:
    body = response.read()
    code, message = "", ""
    try:
        error = json.loads(body).get("error", {})
        code, message = str(error.get("code", "")), str(error.get("message", ""))
    except (ValueError, AttributeError):
        pass
    if not message:
        message = body.decode("utf-8", "replace").strip()[:500] or f"HTTP {response.status}"
    retry_after: float | None = None
    if value := response.headers.get("Retry-After"):
        try:
            retry_after = float(value)
        except ValueError:
            retry_after = None
    return error_for(code or "unknown", message, response.status, retry_after)
