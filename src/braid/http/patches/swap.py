"""Put a subclass of one of hypercorn's classes where hypercorn looks the class up, for a block.

hypercorn picks its TCP server and its protocol classes as module globals when a connection
starts (``hypercorn.trio.run.TCPServer``, ``hypercorn.protocol.H11Protocol``/``H2Protocol``).
braid's replacements (:mod:`braid.http.patches.fast_send`, :mod:`braid.http.patches.h11_body`,
:mod:`braid.http.patches.h2_late_data`) are installed with :func:`swapped`: process-wide, for the
duration of a ``with`` block, the stock class put back on exit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType


@contextmanager
def swapped(module: ModuleType, name: str, stock: type, replacement: type, enabled: bool = True) -> Iterator[None]:
    """Within the block, ``module.name`` is ``replacement`` instead of ``stock``.

    Does nothing when ``enabled`` is false, or when ``module.name`` is not ``stock`` (an outer
    block swapped it already: that block puts it back).
    """
    if not enabled or getattr(module, name) is not stock:
        yield
        return
    setattr(module, name, replacement)
    try:
        yield
    finally:
        setattr(module, name, stock)


__all__ = ["swapped"]
