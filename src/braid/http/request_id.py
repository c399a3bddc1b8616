"""``X-Request-Id`` on every response: vLLM's ``--enable-request-id-headers``, as ASGI middleware.

With ``Settings.serving.request_id_headers`` every HTTP response (any route, an error, a 401, a
404, a CORS preflight) carries one ``X-Request-Id``: the one the app already put on it (a
generating route's: the client's, else the response's own id, ``cmpl-...``), else the client's
``X-Request-Id`` as sent, else a new random id (32 hex digits, vLLM's ``uuid4().hex``). vLLM's
middleware takes the client's or a new one; braid's generating routes name the response's id
instead of a new one, so the header matches the body's ``id`` and the access log's line.

Without the option the middleware is not installed: the generating routes alone send the header
(braid's own behaviour, docs/deploy.md), and nothing else pays for it.
"""

from __future__ import annotations

import uuid
from collections.abc import MutableMapping
from typing import Any

from braid.http.asgi import ASGIApp, Receive, Scope, Send

HEADER = b"x-request-id"


def _client_id(scope: Scope) -> bytes | None:
    for key, value in scope["headers"]:
        if key.lower() == HEADER:
            return bytes(value)
    return None


class RequestIdHeaders:
    """The middleware (see the module's contract)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_id(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                if not any(bytes(k).lower() == HEADER for k, _ in headers):
                    rid = _client_id(scope) or uuid.uuid4().hex.encode()
                    message = {**message, "headers": [*headers, (HEADER, rid)]}
            await send(message)

        await self.app(scope, receive, send_with_id)


def install(app: Any, enabled: bool) -> None:
    """Wrap a quart app's ``asgi_app`` in :class:`RequestIdHeaders` when ``enabled``; call it
    after :func:`braid.http.cors.install`, so that preflights and 401s get the header too."""
    if enabled:
        app.asgi_app = RequestIdHeaders(app.asgi_app)


__all__ = ["RequestIdHeaders", "install"]
