"""Defaults from the environment: ``--some-flag`` from ``BRAID_SOME_FLAG``.

Keys in variables are what this is for: a key on the command line is visible to everyone who
can run ``ps``. The API keys have one variable of their own, :data:`API_KEY_ENV` (one key; a file
of keys with ``--api-key-file``), read where the keys are gathered (:func:`braid.cli.config.api_keys`).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

API_KEY_ENV = "BRAID_API_KEY"
"""An API key from the environment: unlike --api-key, not visible in ``ps``."""

RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
"""vLLM's switch for its LoRA load and unload routes; braid reads it too (as its
``--allow-runtime-lora-updating``), so one environment turns them on in either server."""

_SKIPPED = frozenset({"--help", "--api-key"})
"""Options without a variable of their own (--api-key's is :data:`API_KEY_ENV`)."""
_TRUE, _FALSE = frozenset({"1", "true", "yes", "on"}), frozenset({"0", "false", "no", "off", ""})


def long_flag(action: argparse.Action) -> str:
    """The option's ``--long-form`` (every option braid declares has one)."""
    return next(flag for flag in action.option_strings if flag.startswith("--"))


def env_name(action: argparse.Action) -> str:
    """``BRAID_`` and the option's long flag in capitals, ``-`` as ``_``: named for the flag, not
    for the field its value fills, so the variable is the one an operator can guess."""
    return "BRAID_" + long_flag(action).removeprefix("--").replace("-", "_").upper()


def apply_env_defaults(parser: argparse.ArgumentParser, env: Mapping[str, str] | None) -> None:
    """Defaults from ``env`` (none: no variable is read), and each option's default and variable
    in ``--help``.

    A flag on the command line wins over its variable. A variable is read as the flag's value
    would be (its type and choices; a switch takes 1/true/yes/on or 0/false/no/off; a repeatable
    option takes several values separated by spaces); a bad value stops braid with a message
    naming the variable, as a bad flag would."""
    for action in parser._actions:
        if not action.option_strings or long_flag(action) in _SKIPPED:
            continue
        name = env_name(action)
        shown = "none" if action.default is None or action.default in ((), []) else action.default
        if isinstance(action, argparse._StoreTrueAction):
            shown = "off"
        extra = f"(default: {shown}; env {name})".replace("%", "%%")
        action.help = f"{action.help} {extra}" if action.help else extra
        if env is None or name not in env:
            continue
        raw = env[name]
        try:
            value = _env_value(action, raw)
        except (ValueError, argparse.ArgumentTypeError) as exc:
            parser.error(f"{name}={raw!r}: {exc}")
        parser.set_defaults(**{action.dest: value})


def _env_value(action: argparse.Action, raw: str) -> Any:
    if isinstance(action, argparse._StoreTrueAction):
        if raw.strip().lower() not in _TRUE | _FALSE:
            raise ValueError("expected 1/true/yes/on or 0/false/no/off")
        return raw.strip().lower() in _TRUE
    convert = action.type if callable(action.type) else str
    if isinstance(action, argparse._AppendAction):
        values = [convert(part) for part in raw.split()]
    else:
        values = [convert(raw)]
    for v in values:
        if action.choices is not None and v not in action.choices:
            raise ValueError(f"expected one of {', '.join(map(str, action.choices))}")
    return values if isinstance(action, argparse._AppendAction) else values[0]


__all__ = ["API_KEY_ENV", "RUNTIME_LORA_ENV", "apply_env_defaults", "env_name", "long_flag"]
