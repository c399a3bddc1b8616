"""Option values from text: the ``type=`` of ``braid``'s options, for a flag and its variable alike.

Each raises :class:`argparse.ArgumentTypeError` (or ValueError) with a message that argparse
shows after the flag's or the variable's name.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from braid.addresses import parse_allowed
from braid.http.auth import parse_key_file


def engine_arg(text: str) -> tuple[str, Any]:
    """``KEY=VALUE``: the key with ``-`` as ``_``, the value as JSON, or the text if it is none."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key.replace("-", "_"), json.loads(value)
    except json.JSONDecodeError:
        return key.replace("-", "_"), value


def json_object(text: str) -> dict[str, Any]:
    """A JSON object (vLLM's form for its config flags, such as ``--kv-events-config``)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def lora_module(text: str) -> tuple[str, str]:
    """A LoRA adapter of ``--lora-modules``, in vLLM's two forms: ``NAME=PATH``, or a JSON object
    ``{"name": ..., "path": ...}`` (vLLM's rule: a text with ``=`` and no ``,`` is the first form).
    A JSON ``base_model_name`` is taken and ignored: braid serves one model, which vLLM would name
    as the parent anyway."""
    if "=" in text and "," not in text:
        name, _, path = text.partition("=")
    else:
        try:
            spec = json.loads(text)
        except json.JSONDecodeError:
            raise argparse.ArgumentTypeError(f"expected NAME=PATH or a JSON object, got {text!r}") from None
        if not isinstance(spec, dict) or not {"name", "path"} <= spec.keys() <= {"name", "path", "base_model_name"}:
            raise argparse.ArgumentTypeError(
                f'expected {{"name": ..., "path": ...}} (and optionally "base_model_name"), got {text!r}'
            )
        name, path = spec["name"], spec["path"]
    if not isinstance(name, str) or not isinstance(path, str) or not name or not path:
        raise argparse.ArgumentTypeError(f"a LoRA module needs a name and a path, got {text!r}")
    return name, path


def positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, not {text}")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, not {text}")
    return value


def key_file(path: str) -> list[str]:
    """The keys in the file at ``path`` (:func:`braid.http.auth.parse_key_file`); an unreadable
    file, or one without keys, is an error."""
    try:
        with open(path, encoding="utf-8") as f:
            keys = parse_key_file(f.read())
    except (OSError, UnicodeDecodeError) as exc:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {exc}") from None
    if not keys:
        # An empty file must not leave the server open when its owner meant to close it.
        raise argparse.ArgumentTypeError(f"no keys in {path}")
    return keys


def allowed_peers(text: str) -> tuple[str, ...]:
    """Comma-separated addresses, networks or ``*`` (:func:`braid.addresses.parse_allowed`)."""
    try:
        return parse_allowed(part for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


__all__ = ["allowed_peers", "engine_arg", "json_object", "key_file", "positive", "positive_int"]
