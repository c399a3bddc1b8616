"""Counting: every HTTP answer by route and status, at the ASGI edge.

:class:`StatusCounter` wraps the whole app, outside the API-key guard and CORS, so a 401, a
preflight, a 413 from quart's body limit and a 404 are counted like any answer. It reads the
status of each ``http.response.start`` the app sends; a connection that ends before the app
answered (a client gone during the body read) sends none and is not counted. The ``route``
label is the request path when it is one of the app's routes, the route's template for a
path with an id in it (``/v1/files/{file_id}``), else ``other``, so a client cannot grow the
metric's label set. Nothing is done per body chunk. The labelled child of each
(route, status) is made once and kept (prometheus_client's ``labels()`` takes a lock and builds
its key on every call); routes are the app's few and statuses are three-digit numbers, so the
cache stays small.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from prometheus_client import Counter

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _is_parameter(segment: str) -> bool:
    return segment.startswith("{") and segment.endswith("}")


class RouteLabels:
    """The ``route`` label of a request path: the route itself, its template, or ``other``."""

    def __init__(self, routes: frozenset[str]) -> None:
        self._exact = frozenset(r for r in routes if "{" not in r)
        self._templates = tuple((r, r.split("/")) for r in sorted(routes) if "{" in r)

    def __call__(self, path: str) -> str:
        if path in self._exact:
            return path
        if self._templates:
            parts = path.split("/")
            for template, pattern in self._templates:
                if len(pattern) == len(parts) and all(
                    (_is_parameter(want) and got) or want == got for want, got in zip(pattern, parts, strict=True)
                ):
                    return template
        return "other"


class StatusCounter:
    def __init__(self, app: ASGIApp, counter: Counter, routes: frozenset[str]) -> None:
        self._app = app
        self._counter = counter
        self._label = RouteLabels(routes)
        self._children: dict[tuple[str, int], Counter] = {}

    def _child(self, route: str, status: int) -> Counter:
        child = self._children.get((route, status))
        if child is None:
            child = self._children[route, status] = self._counter.labels(route=route, status=str(status))
        return child

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        path = scope.get("path", "")
        route = self._label(path)
        child = self._child

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                child(route, message["status"]).inc()
            await send(message)

        await self._app(scope, receive, counting_send)


def install(app: Any, counter: Counter, routes: frozenset[str]) -> None:
    """Wrap a quart app's ``asgi_app`` in a :class:`StatusCounter` (outside whatever wraps it now)."""
    app.asgi_app = StatusCounter(app.asgi_app, counter, routes)


__all__ = ["StatusCounter", "install"]
