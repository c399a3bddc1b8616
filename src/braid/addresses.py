"""Peer addresses as an operator names them: IP addresses, networks, or ``*`` for any peer.

The list of proxies whose forwarded headers are trusted (``--forwarded-allow-ips``) is parsed
here, once, into the normalised form that :class:`~braid.settings.Settings` keeps and
:class:`~braid.http.forwarded.ForwardedFor` compares against. No HTTP here: the settings read it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable


def parse_allowed(values: Iterable[str]) -> tuple[str, ...]:
    """Each value (surrounding whitespace stripped) is ``*``, an IP address or a network
    (``10.0.0.0/8``); ValueError otherwise. Returns them normalised (``::1``, ``10.0.0.0/8``): a
    network's host bits cleared, so the same peer is always written the same way."""
    out = []
    for value in values:
        value = value.strip()
        if value == "*":
            out.append(value)
        elif "/" in value:
            out.append(str(ipaddress.ip_network(value, strict=False)))
        else:
            out.append(str(ipaddress.ip_address(value)))
    return tuple(out)


__all__ = ["parse_allowed"]
