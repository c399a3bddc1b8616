"""The ASGI callables braid's middlewares take and are: one declaration for all of them.

:mod:`braid.http.auth`, :mod:`braid.http.cors`, :mod:`braid.http.forwarded` and
:mod:`braid.http.access_log` each wrap an app in one of these, so they depend on this module
and not on each other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

__all__ = ["ASGIApp", "Message", "Receive", "Scope", "Send"]
