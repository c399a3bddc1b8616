"""braid's patches of hypercorn, trio, h11, h2 and quart-trio: all of them, and their one installer.

Each module here holds one patch, as a :class:`~braid.http.patches.patch.Patch` named ``PATCH``,
and its docstring states the patch's contract and why it exists. :data:`PATCHES` lists them in
install order. :func:`installed` is the only way any of them is installed: it puts each patch
that :class:`PatchOptions` has on at its target for the duration of a ``with`` block, and puts
upstream's objects back after. ``braid.http.server.serve`` runs hypercorn inside that block.

Several patches replace the same class (hypercorn's ``TCPServer`` has five). Each is a subclass
of the upstream class that works on its own, and the installer stacks the ones that are on, in
the order of :data:`PATCHES`: each later one subclasses what the earlier left, so its ``super()``
reaches them, and hypercorn's class last. No patch needs another. The order matters once:
fast send comes after the write deadline, so the rest of a chunk that fast send could not write
at once goes through the write deadline's bounded write when both are on
(:mod:`~braid.http.patches.locked_send`).

Before it installs anything, :func:`installed` checks that the upstream names the chosen patches
rely on still exist (:func:`missing_upstream_names`), and refuses with :class:`UpstreamChanged`,
naming each missing one, if not; tests/http/patches/test_upstream_names.py runs the same check
for every patch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs

from braid.http.patches import (
    accept,
    client_close,
    fast_send,
    final_send,
    h2_late_data,
    h11_body,
    isolate,
    keep_alive,
    write_deadline,
)
from braid.http.patches.patch import MissingName, Patch, PatchSettings, Upstream, missing_names

PATCHES: tuple[Patch, ...] = (
    accept.PATCH,
    isolate.PATCH,
    keep_alive.PATCH,
    client_close.PATCH,
    write_deadline.PATCH,
    fast_send.PATCH,
    h11_body.PATCH,
    h2_late_data.PATCH,
    final_send.PATCH,
)
"""Every patch, in install order (for one target: innermost first)."""


@attrs.frozen
class PatchOptions:
    """Which patches are on: one switch per patch, named as the patch; all on by default.

    ``braid serve --stock-send`` is ``PatchOptions(fast_send=False)``.
    """

    accept: bool = True
    isolate: bool = True
    keep_alive: bool = True
    client_close: bool = True
    write_deadline: bool = True
    fast_send: bool = True
    h11_body: bool = True
    h2_late_data: bool = True
    final_send: bool = True

    @classmethod
    def only(cls, *names: str) -> PatchOptions:
        """These patches on, every other off (none: upstream as it is)."""
        _check_names(names)
        return cls(**{field.name: field.name in names for field in attrs.fields(cls)})

    def without(self, *names: str) -> PatchOptions:
        """These options with the named patches off."""
        _check_names(names)
        return attrs.evolve(self, **dict.fromkeys(names, False))

    def chosen(self) -> tuple[Patch, ...]:
        """The patches that are on, in install order."""
        return tuple(patch for patch in PATCHES if getattr(self, patch.name))


def _check_names(names: Iterable[str]) -> None:
    unknown = set(names) - {patch.name for patch in PATCHES}
    if unknown:
        raise ValueError(f"no such patch: {', '.join(sorted(unknown))}")


class UpstreamChanged(RuntimeError):
    """The installed hypercorn, trio, h11, h2 or quart-trio lacks a name a chosen patch relies on."""

    def __init__(self, missing: Iterable[MissingName]) -> None:
        self.missing = tuple(missing)
        lines = "".join(f"\n  {name}" for name in self.missing)
        super().__init__(
            f"braid's HTTP patches do not fit the installed packages, which lack what they rely on:{lines}"
        )


def missing_upstream_names(patches: Iterable[Patch] = PATCHES) -> tuple[MissingName, ...]:
    """Each upstream name one of ``patches`` (by default, every patch) relies on that is gone."""
    return missing_names(patches)


@attrs.define
class _Installed:
    key: tuple[PatchOptions, PatchSettings]
    originals: list[tuple[Upstream, Any]]
    """Each target the patches replaced, with what was there before, in the order replaced."""
    users: int = 1


_installed: _Installed | None = None


def _install(patches: Iterable[Patch], settings: PatchSettings) -> list[tuple[Upstream, Any]]:
    originals: list[tuple[Upstream, Any]] = []
    try:
        for patch in patches:
            target = patch.target
            owner = target.owner()
            current = getattr(owner, target.attribute)
            if all(done != target for done, _ in originals):
                originals.append((target, current))
            setattr(owner, target.attribute, patch.apply(current, settings))
    except BaseException:
        _restore(originals)
        raise
    return originals


def _restore(originals: list[tuple[Upstream, Any]]) -> None:
    for target, original in reversed(originals):
        setattr(target.owner(), target.attribute, original)


@contextmanager
def installed(options: PatchOptions = PatchOptions(), settings: PatchSettings | None = None) -> Iterator[None]:
    """Within the block, the patches ``options`` has on are installed, process-wide; upstream's
    objects are put back when the last block ends.

    Blocks may nest or overlap (a second server started while one runs): they share the one
    installation, which must then be the same, since hypercorn looks its classes up process-wide.
    Raises :class:`UpstreamChanged`, before installing anything, if a chosen patch relies on an
    upstream name that is gone, and ``RuntimeError`` for a block whose options differ from the
    installation in place.
    """
    global _installed
    settings = settings or PatchSettings()
    key = (options, settings)
    if _installed is None:
        chosen = options.chosen()
        missing = missing_upstream_names(chosen)
        if missing:
            raise UpstreamChanged(missing)
        _installed = _Installed(key, _install(chosen, settings))
    elif _installed.key != key:
        raise RuntimeError(
            f"braid's HTTP patches are installed process-wide as {_installed.key}; a second server in "
            f"this process cannot have {key}"
        )
    else:
        _installed.users += 1
    active = _installed
    try:
        yield
    finally:
        active.users -= 1
        if active.users == 0:
            _restore(active.originals)
            _installed = None


__all__ = [
    "PATCHES",
    "MissingName",
    "Patch",
    "PatchOptions",
    "PatchSettings",
    "UpstreamChanged",
    "installed",
    "missing_upstream_names",
]
