"""Forwarded headers: the client's address from ``X-Forwarded-For``, only from trusted proxies.

Behind a proxy (nginx) the peer of every connection is the proxy. With ``--forwarded-allow-ips``
(``Settings.forwarded_allow_ips``) a request whose peer is one of the listed addresses or networks
(or any peer, with ``*``) gets its ``scope["client"]`` from ``X-Forwarded-For`` and its
``scope["scheme"]`` from ``X-Forwarded-Proto``; the access log (:mod:`braid.http.access_log`)
then shows the client, not the proxy. A request from any other peer keeps its peer's address:
a client that reaches braid directly cannot put an address of its choice in the log.

Which address of the header: a proxy *appends* the address it saw, so the header reads
``client, proxy1, proxy2`` and only the right end is written by trusted hands. The client is the
rightmost address that is not itself a trusted proxy (uvicorn's rule, which vLLM's server
follows); if every address is trusted, or with ``*``, the leftmost. An entry may carry a port
(``1.2.3.4:5678``, ``[::1]:5678``), which becomes the client's; else its port is 0. With ``*`` the leftmost is
what the first proxy was told, so ``*`` is for a braid that only trusted proxies can reach, each
of which overwrites the header rather than appends to it.

Not hypercorn's ``ProxyFixMiddleware``: it trusts the headers from any peer, so it would need
this peer check around it anyway; its rule is a fixed hop count (``trusted_hops``), not the
trusted proxies skipped from the right; it replaces the ``Host`` header too; and it deep-copies every request's scope. Without allowed peers the
middleware is not installed: the headers are ignored.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

from braid.addresses import parse_allowed
from braid.http.asgi import ASGIApp, Receive, Scope, Send

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_SCHEMES = frozenset({"http", "https"})


def host_port(entry: str) -> tuple[str, int]:
    """An ``X-Forwarded-For`` entry: ``1.2.3.4``, ``1.2.3.4:5678``, ``::1``, ``[::1]:5678``. What
    is none of these (``unknown``, a name) is returned whole, port 0, and is never trusted."""
    host, port = entry, ""
    if entry.startswith("["):
        inside, bracket, rest = entry[1:].partition("]")
        if bracket and (not rest or rest.startswith(":")):
            host, port = inside, rest[1:]
    elif entry.count(":") == 1:
        host, _, port = entry.partition(":")
    if port:
        if not port.isdigit():
            return entry, 0
        return host, int(port)
    return host, 0


class ForwardedFor:
    """The ASGI middleware around the app (see the module's contract)."""

    def __init__(self, app: ASGIApp, allowed: Iterable[str]) -> None:
        self.app = app
        allowed = parse_allowed(allowed)
        if not allowed:
            raise ValueError("ForwardedFor needs at least one allowed peer")
        self._any = "*" in allowed
        self._addresses = frozenset(a for a in allowed if "/" not in a)
        self._networks: tuple[Network, ...] = tuple(ipaddress.ip_network(a) for a in allowed if "/" in a)

    def trusted(self, host: str) -> bool:
        """Whether ``host`` (a peer, or an address of the header) is an allowed proxy."""
        if self._any or host in self._addresses:
            return True
        if not self._networks:
            return False
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in network for network in self._networks)

    def client(self, forwarded_for: list[str]) -> tuple[str, int] | None:
        """The client's (address, port) from the header's entries, in order (see the module's
        rule); the port is 0 unless the entry has one."""
        if not forwarded_for:
            return None
        if not self._any:
            for entry in reversed(forwarded_for):
                host, port = host_port(entry)
                if not self.trusted(host):
                    return host, port
        return host_port(forwarded_for[0])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        peer = scope.get("client")
        if scope["type"] in ("http", "websocket") and peer and self.trusted(peer[0]):
            scope = self._rewrite(scope)
        await self.app(scope, receive, send)

    def _rewrite(self, scope: Scope) -> Scope:
        addresses: list[str] = []
        proto = None
        for name, value in scope["headers"]:
            name = name.lower()
            if name == b"x-forwarded-for":
                addresses += [a for a in (p.strip() for p in value.decode("latin-1").split(",")) if a]
            elif name == b"x-forwarded-proto":
                proto = value.decode("latin-1").rsplit(",", 1)[-1].strip().lower()
        client = self.client(addresses)
        if client is None and proto not in _SCHEMES:
            return scope
        # A copy: the server keeps the scope it made (hypercorn reads it after the app returns).
        scope = dict(scope)
        if client is not None:
            scope["client"] = client
        if proto in _SCHEMES:
            scope["scheme"] = proto if scope["type"] == "http" else {"http": "ws", "https": "wss"}[proto]
        return scope


def install(app: Any, allowed: Iterable[str]) -> None:
    """Wrap a quart app's ``asgi_app`` in a :class:`ForwardedFor` when ``allowed`` is not empty."""
    allowed = tuple(allowed)
    if allowed:
        app.asgi_app = ForwardedFor(app.asgi_app, allowed)


__all__ = ["ForwardedFor", "host_port", "install"]
