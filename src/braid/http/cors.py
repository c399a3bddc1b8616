"""CORS: ASGI middleware, outside :mod:`braid.http.auth`, installed only with allowed origins.

The contract, when ``Settings.allowed_origins`` is not empty (``"*"`` among them: any origin):

* A preflight (``OPTIONS`` with ``Origin`` and ``Access-Control-Request-Method``) from an
  allowed origin is answered here, 204, without a key (browsers send none on a preflight) and
  without reaching the app: ``Access-Control-Allow-Origin``, ``-Allow-Methods`` (GET, POST),
  ``-Allow-Headers`` (the ones the browser asked for, so ``Authorization`` too) and
  ``-Max-Age``. The request that follows still needs its key.
* Any other response to a request from an allowed origin, 401s included (so a page can read
  why it was refused), gets ``Access-Control-Allow-Origin``.
* A request from an origin not allowed, or with no ``Origin``, gets no ``Access-Control-*``
  header; its preflight goes on to the key check and the app like any request.
* With a list of origins (not ``"*"``), the allowed origin is echoed and ``Vary: Origin`` is
  added, so a cache does not hand one origin's answer to another.

Without allowed origins the middleware is not installed: no CORS header is ever sent.
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from typing import Any

from braid.http.asgi import ASGIApp, Receive, Scope, Send
from braid.settings import Settings

PREFLIGHT_MAX_AGE = 600
"""Seconds a browser may cache a preflight's answer."""


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key.lower() == name:
            return bytes(value)
    return None


class Cors:
    """The CORS middleware (see the module's contract)."""

    def __init__(self, app: ASGIApp, origins: Iterable[str]) -> None:
        self.app = app
        origins = set(origins)
        self._any = "*" in origins
        self._origins = frozenset(o.encode() for o in origins)

    def _allow(self, origin: bytes | None) -> list[tuple[bytes, bytes]]:
        """The headers naming ``origin`` as allowed, or none when it is not."""
        if origin is None:
            return []
        if self._any:
            return [(b"access-control-allow-origin", b"*")]
        if origin in self._origins:
            return [(b"access-control-allow-origin", origin), (b"vary", b"Origin")]
        return [(b"vary", b"Origin")]  # not allowed: no CORS header, but the answer depends on it

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        origin = _header(scope, b"origin")
        allow = self._allow(origin)
        allowed = any(k == b"access-control-allow-origin" for k, _ in allow)
        if allowed and scope["method"] == "OPTIONS" and _header(scope, b"access-control-request-method") is not None:
            await self._preflight(scope, send, allow)
            return

        async def send_with_cors(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start" and allow:
                message = {**message, "headers": [*message.get("headers", ()), *allow]}
            await send(message)

        await self.app(scope, receive, send_with_cors)

    async def _preflight(self, scope: Scope, send: Send, allow: list[tuple[bytes, bytes]]) -> None:
        headers = [
            *allow,
            (b"access-control-allow-methods", b"GET, POST"),
            (b"access-control-max-age", str(PREFLIGHT_MAX_AGE).encode()),
        ]
        requested = _header(scope, b"access-control-request-headers")
        if requested:
            headers.append((b"access-control-allow-headers", requested))
        await send({"type": "http.response.start", "status": 204, "headers": headers})
        await send({"type": "http.response.body", "body": b""})


def install(app: Any, settings: Settings) -> None:
    """Wrap a quart app's ``asgi_app`` in :class:`Cors` when ``settings.allowed_origins`` is set;
    call it after :func:`braid.http.auth.install`, so that CORS is the outer layer."""
    if settings.allowed_origins:
        app.asgi_app = Cors(app.asgi_app, settings.allowed_origins)


__all__ = ["PREFLIGHT_MAX_AGE", "Cors", "install"]
