"""Load tracking: the count behind ``GET /load``, kept at the ASGI edge.

:class:`LoadCounter` wraps the app inside the API-key guard (a refused request is never counted)
and counts each ``POST`` to a generating route (:data:`braid.routes.load.GENERATING`) for as long
as the app's call for it lasts: from when the app takes the request to when its answer has been
sent in full, or its client has gone and the call has ended. That call spans the admission wait,
the run and the whole stream, so the count is :mod:`braid.routes.load`'s figure exactly, with one
increment and one decrement per request and nothing per chunk. The decrement is in a
``finally``: a cancelled or failed call (a client gone, a drain out of time) still leaves.
"""

from __future__ import annotations

from typing import Any

from braid.http.asgi import ASGIApp, Receive, Scope, Send
from braid.routes.load import GENERATING, ServerLoad


class LoadCounter:
    def __init__(self, app: ASGIApp, load: ServerLoad, paths: frozenset[str] = GENERATING) -> None:
        self._app = app
        self._load = load
        self._paths = paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") not in self._paths:
            await self._app(scope, receive, send)
            return
        self._load.open += 1
        try:
            await self._app(scope, receive, send)
        finally:
            self._load.open -= 1


def install(app: Any, load: ServerLoad) -> None:
    """Wrap a quart app's ``asgi_app`` in a :class:`LoadCounter` when ``load`` is tracked (with
    the flag off nothing is installed, so the figure costs nothing)."""
    if load.tracking:
        app.asgi_app = LoadCounter(app.asgi_app, load)


__all__ = ["LoadCounter", "install"]
