"""What a patch of hypercorn, trio, h11, h2 or quart-trio is, and how one is checked against upstream.

A :class:`Patch` replaces one upstream object, found at its :attr:`~Patch.target` (a module global
such as ``hypercorn.trio.run.TCPServer``, or a class attribute such as quart-trio's
``QuartTrio.asgi_http_class``), by what its :attr:`~Patch.apply` makes of the object there. Most
patches are a subclass of an upstream class, and :func:`stacked` makes their ``apply``: several
patches of one target stack, each subclassing what the one before left. The installer
(:func:`braid.http.patches.installed`) is the only code that writes a target.

Every patch lists the upstream names it relies on (:attr:`~Patch.relies_on`): the private names it
reads or overrides, which an upgrade may remove or rename without notice. :func:`missing_names`
says which of them the installed versions no longer have, so that an upgrade fails a test, and
``braid serve`` refuses to start, with the name in the message, rather than a patch silently
doing nothing or failing on a client's request.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import inspect
import re
from collections.abc import Callable, Iterable
from typing import Any

import attrs


@attrs.frozen
class Upstream:
    """A name in an upstream package: ``path`` (dotted) inside the module ``module``.

    With ``instance``, the last part of ``path`` is an attribute that the class's own code sets on
    its instances (``self.send_lock = ...``), not one the class has: it exists while some class in
    the owner's MRO assigns it in its source.
    """

    module: str
    path: str
    instance: bool = False

    def __str__(self) -> str:
        return f"{self.module}.{self.path}"

    @property
    def attribute(self) -> str:
        return self.path.rpartition(".")[2]

    def owner(self) -> Any:
        """The object that holds the name (the module, or the class); raises if that is gone."""
        owner: Any = importlib.import_module(self.module)
        for part in self.path.split(".")[:-1]:
            owner = getattr(owner, part)
        return owner

    def exists(self) -> bool:
        try:
            owner = self.owner()
        except (ImportError, AttributeError):
            return False
        if self.instance:
            return isinstance(owner, type) and _sets_on_instances(owner, self.attribute)
        return hasattr(owner, self.attribute)

    def distribution(self) -> str:
        """The installed distribution the name comes from, with its version (``hypercorn 0.18.0``)."""
        top = self.module.partition(".")[0]
        for dist in importlib.metadata.packages_distributions().get(top, [top]):
            try:
                return f"{dist} {importlib.metadata.version(dist)}"
            except importlib.metadata.PackageNotFoundError:
                continue
        return top


@functools.cache
def _source(cls: type) -> str:
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):  # a builtin, or a class made at run time
        return ""


def _sets_on_instances(cls: type, attribute: str) -> bool:
    assignment = re.compile(rf"\bself\.{re.escape(attribute)}\s*(?::[^=\n]*)?=(?!=)")
    return any(assignment.search(_source(klass)) for klass in cls.__mro__ if klass is not object)


ACCEPT_BATCH = 64
"""The most connections one turn of the accept loop takes without yielding (:mod:`braid.http.patches.accept`)."""


@attrs.frozen
class PatchSettings:
    """What a patch takes besides being on or off: one value so far, for :mod:`braid.http.patches.accept`."""

    accept_batch: int = attrs.field(default=ACCEPT_BATCH, validator=attrs.validators.gt(0))
    """Connections one turn of hypercorn's accept loop takes; 1 leaves trio's own loop."""


Apply = Callable[[Any, PatchSettings], Any]
"""What a patch makes of the object at its target (hypercorn's, or an earlier patch's) while it is on."""


@attrs.frozen
class Patch:
    name: str
    """Its switch: the :class:`~braid.http.patches.PatchOptions` field that turns it on or off."""
    module: str
    """The braid module that holds it, whose docstring is its contract."""
    why: str
    """One line: what goes wrong without it."""
    target: Upstream
    """Where upstream looks up what the patch replaces."""
    apply: Apply
    relies_on: tuple[Upstream, ...]
    """The upstream names, besides its target, that the patch reads, overrides or depends on."""

    @property
    def upstream_names(self) -> tuple[Upstream, ...]:
        return (self.target, *self.relies_on)


def stacked(mixin: type, upstream: type) -> Apply:
    """``apply`` for a patch that is a subclass (``mixin``) of the upstream class ``upstream``.

    On ``upstream`` itself the result is ``mixin``; on a subclass of it (an earlier patch of the
    same target, or a test's double) it is a new class with ``mixin`` first in its MRO, so each
    patch's ``super()`` reaches the one installed before it, and hypercorn's class last.
    """

    def apply(current: Any, settings: PatchSettings) -> type:
        if not (isinstance(current, type) and issubclass(current, upstream)):
            raise TypeError(f"{mixin.__qualname__} patches {upstream.__qualname__}, not {current!r}")
        if current is upstream:
            return mixin
        return type(f"{mixin.__name__}+{current.__name__}", (mixin, current), {"__module__": mixin.__module__})

    return apply


@attrs.frozen
class MissingName:
    patch: Patch
    name: Upstream

    def __str__(self) -> str:
        what = f"{self.name} (set on its instances)" if self.name.instance else str(self.name)
        return (
            f"{what} is gone: {self.patch.module} relies on it; re-check the patch against the new "
            f"{self.name.distribution()}, or install the version pyproject.toml pins"
        )


def missing_names(patches: Iterable[Patch]) -> tuple[MissingName, ...]:
    """Each upstream name that one of ``patches`` relies on and the installed packages lack."""
    return tuple(MissingName(patch, name) for patch in patches for name in patch.upstream_names if not name.exists())


__all__ = ["ACCEPT_BATCH", "Apply", "MissingName", "Patch", "PatchSettings", "Upstream", "missing_names", "stacked"]
