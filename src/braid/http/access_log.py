"""The access log: one line per HTTP request, at the ASGI edge (``--access-log``).

:class:`AccessLog` wraps the app inside :mod:`braid.http.forwarded` (so the remote address is
the forwarded client's when the peer is a trusted proxy) and outside everything else, so a 401,
a preflight, a 404 and a 413 are logged like any answer. When the app returns (the response
sent, or the request cancelled: a client gone, a drain cut short) it logs one INFO record on the
``braid.access`` logger (:mod:`braid.logs` sends it to stdout) whose fields are:

* ``remote``: the client's address (no port), or None;
* ``method`` and ``path``: the request target's path as the client sent it (``raw_path``, still
  percent-encoded, without the query string);
* ``status``: the status braid sent; 500 when the app failed before answering (hypercorn then
  sends one); None when no answer was started (the client went away before it, or a drain cut
  the request);
* ``bytes``: the response body bytes handed to the server (for a cut stream, those sent so far);
* ``duration_ms``: from the request reaching the app to the end of its response;
* ``request_id``: the client's ``X-Request-Id``, else the one braid put on the response, or None;
* ``user_agent``: the client's ``User-Agent``, or None.

The path, request id and user agent are cut at :data:`MAX_VALUE_CHARS`.

The record's message is those fields as one readable line
(``127.0.0.1 "POST /v1/completions" 200 1834B 12.3ms id=cmpl-1 "curl/8.5.0"``, None as ``-``),
with any value a client chose written as an ASCII JSON string when it holds a quote, a backslash
or an unprintable character, so one request is always one line. Nothing comes from the body. Requests that hypercorn answers itself (a malformed request, a header block over the
limit) never reach the app and are not logged. Per body chunk the only work is adding its
length; the line is built once, when the request ends, and not at all when the logger is off.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from braid.http.asgi import ASGIApp, Receive, Scope, Send
from braid.logs import ACCESS_LOGGER

Message = dict[str, Any]

MAX_VALUE_CHARS = 512
"""A longer path, request id or user agent (a client's choice, up to the header limit) is cut
to this many characters and ``...``: a client cannot make one line 64 KiB long."""


def _clip(text: str) -> str:
    return text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS] + "..."


def _quote(text: str) -> str:
    # The rare path (a value with a quote or an unprintable character): json.dumps escapes every
    # non-ASCII character too, so no line break of any kind (U+0085 from a latin-1 header) is left.
    return json.dumps(text)


def _quoted(text: str) -> str:
    if text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'
    return _quote(text)


def _bare(text: str | None) -> str:
    if text is None:
        return "-"
    if text and text.isprintable() and " " not in text and '"' not in text and "\\" not in text:
        return text
    return _quote(text)


def text_line(fields: dict[str, Any]) -> str:
    """The readable line of an access record's fields (see the module's example)."""
    status = fields["status"]
    ua = fields["user_agent"]
    return (
        f"{_bare(fields['remote'])} {_quoted(fields['method'] + ' ' + fields['path'])} "
        f"{'-' if status is None else status} {fields['bytes']}B {fields['duration_ms']:.1f}ms "
        f"id={_bare(fields['request_id'])} {'-' if ua is None else _quoted(ua)}"
    )


class AccessLog:
    """The ASGI middleware around the app (see the module's contract)."""

    def __init__(self, app: ASGIApp, logger: logging.Logger | None = None) -> None:
        self.app = app
        self.logger = logger if logger is not None else logging.getLogger(ACCESS_LOGGER)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        request_id = user_agent = None
        for name, value in scope["headers"]:
            name = name.lower()
            if name == b"x-request-id":
                request_id = value.decode("latin-1")
            elif name == b"user-agent":
                user_agent = value.decode("latin-1")
        status: int | None = None
        sent = 0

        async def logging_send(message: Message) -> None:
            nonlocal status, sent, request_id
            kind = message["type"]
            if kind == "http.response.body":
                sent += len(message.get("body", b""))
            elif kind == "http.response.start":
                status = message["status"]
                if request_id is None:
                    for name, value in message.get("headers", ()):
                        if name.lower() == b"x-request-id":
                            request_id = value.decode("latin-1")
            await send(message)

        try:
            await self.app(scope, receive, logging_send)  # type: ignore[arg-type]
        except Exception:
            if status is None:
                status = 500  # what hypercorn answers an app's error with
            raise
        finally:
            if self.logger.isEnabledFor(logging.INFO):
                self._log(scope, status, sent, time.perf_counter() - start, request_id, user_agent)

    def _log(
        self,
        scope: Scope,
        status: int | None,
        sent: int,
        duration: float,
        request_id: str | None,
        user_agent: str | None,
    ) -> None:
        client = scope.get("client")
        raw_path = scope.get("raw_path")
        fields = {
            "remote": client[0] if client else None,
            "method": scope["method"],
            "path": _clip(raw_path.decode("latin-1") if raw_path else scope["path"]),
            "status": status,
            "bytes": sent,
            "duration_ms": round(duration * 1000, 3),
            "request_id": None if request_id is None else _clip(request_id),
            "user_agent": None if user_agent is None else _clip(user_agent),
        }
        # A record made here rather than through logger.info, which would walk the stack for the
        # caller's file and line (no use in an access line) on every request.
        record = self.logger.makeRecord(
            self.logger.name, logging.INFO, "", 0, text_line(fields), (), None, extra={"access": fields}
        )
        self.logger.handle(record)


def install(app: Any, enabled: bool) -> None:
    """Wrap a quart app's ``asgi_app`` in an :class:`AccessLog` when ``enabled``."""
    if enabled:
        app.asgi_app = AccessLog(app.asgi_app)


__all__ = ["MAX_VALUE_CHARS", "AccessLog", "install", "text_line"]
