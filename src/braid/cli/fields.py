"""Options that fill the fields of an attrs class: one declaration per option, no restated defaults.

An option declared with :func:`add_field_option` stores its value under the name of the field it
fills and takes that field's default, so the class that owns the option (``Settings``,
``ServerConfig``, ``EngineOptions``) is the one place its default is written. :func:`from_args`
then builds the class from the parsed arguments: every field an option stored a value for takes
that value. A field filled from several options (or none) is given to it explicitly.
"""

from __future__ import annotations

import argparse
from typing import Any, TypeVar

import attrs

T = TypeVar("T", bound=attrs.AttrsInstance)


def field_default(owner: type[attrs.AttrsInstance], name: str) -> Any:
    """The default ``owner`` declares for its field ``name``; TypeError for a field without a
    plain default (a factory), which an option could not show in ``--help``."""
    default = attrs.fields_dict(owner)[name].default
    if default is attrs.NOTHING or isinstance(default, attrs.Factory):  # type: ignore[arg-type]  # a class at run time
        raise TypeError(f"{owner.__name__}.{name} has no plain default for its option to take")
    return default


def add_field_option(
    group: argparse._ActionsContainer, owner: type[attrs.AttrsInstance], name: str, flag: str, **kwargs: Any
) -> argparse.Action:
    """Add ``flag`` as the option that fills ``owner``'s field ``name``: its value is stored as
    ``args.<name>`` and its default is the field's. ``kwargs`` are ``add_argument``'s but
    ``dest`` and ``default``. A repeatable option (``action="append"``) starts from the default
    as a list, which argparse appends to; the metavar is the flag's (or the choices), as argparse
    would make it without the ``dest``."""
    default = field_default(owner, name)
    if kwargs.get("action") in ("append", "extend"):
        default = list(default)
    if "choices" not in kwargs and kwargs.get("action") not in ("store_true", "store_false"):
        kwargs.setdefault("metavar", flag.removeprefix("--").replace("-", "_").upper())
    return group.add_argument(flag, dest=name, default=default, **kwargs)


def from_args(owner: type[T], args: argparse.Namespace, **computed: Any) -> T:
    """An ``owner`` from parsed arguments: each field with an option of its own (one stored under
    the field's name) takes the option's value, each field in ``computed`` that value (it wins),
    and every other field its default. ValueError (or TypeError) as ``owner``'s validators say."""
    given = {field.name: getattr(args, field.name) for field in attrs.fields(owner) if hasattr(args, field.name)}
    return owner(**(given | computed))


__all__ = ["add_field_option", "field_default", "from_args"]
