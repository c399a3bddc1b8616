"""The structured-output constraint an engine request carries: one :class:`Structured`.

A value type of the engine boundary (``SamplingParams.structured_outputs``), by the names of vLLM's
``StructuredOutputsParams``. What a request body may say to ask for one, and how it is refused, is
:mod:`braid.wire.structured`; how vLLM gets it, :mod:`braid.engine.vllm_common`.
"""

from __future__ import annotations

from collections.abc import Sized
from typing import Any, Literal

import attrs

Kind = Literal["json", "regex", "choice", "grammar", "json_object", "structural_tag"]
KINDS: tuple[Kind, ...] = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


def _none_or_nonempty(_instance: object, attribute: attrs.Attribute[Any], value: Sized | None) -> None:
    if value is not None and len(value) == 0:
        raise ValueError(f"{attribute.name} cannot be empty")


@attrs.frozen
class Structured:
    """One structured-output constraint, by the names of vLLM's ``StructuredOutputsParams``.

    Exactly one of the constraint fields (``KINDS``) is set; :attr:`kind` says which. ``json``
    is the schema as JSON text (a JSON object), ``choice`` a non-empty tuple, ``json_object``
    ``True`` or ``False`` (not set). The three options only tune how a backend compiles the
    constraint. ``source`` is the body field the constraint came from, for error messages; it
    takes no part in equality.
    """

    json: str | None = attrs.field(default=None, validator=_none_or_nonempty)
    regex: str | None = None
    choice: tuple[str, ...] | None = attrs.field(default=None, validator=_none_or_nonempty)
    grammar: str | None = attrs.field(default=None, validator=_none_or_nonempty)
    json_object: bool = False
    structural_tag: str | None = attrs.field(default=None, validator=_none_or_nonempty)
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    source: str = attrs.field(default="structured_outputs", eq=False)

    def __attrs_post_init__(self) -> None:
        given = [kind for kind in KINDS if self.value_of(kind) is not None]
        if len(given) != 1:
            raise ValueError(f"a Structured holds exactly one constraint, not {given or 'none'}")

    def value_of(self, kind: Kind) -> object:
        """The value of constraint ``kind``, ``None`` when it is not the one set."""
        if kind == "json_object":
            return True if self.json_object else None
        value: object = getattr(self, kind)
        return value

    @property
    def kind(self) -> Kind:
        return next(kind for kind in KINDS if self.value_of(kind) is not None)


__all__ = ["KINDS", "Kind", "Structured"]
