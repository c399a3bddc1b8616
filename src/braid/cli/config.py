"""``braid serve``'s parsed arguments as the options objects the rest of braid takes.

Each option that fills one field is declared once, in :mod:`braid.cli.parser`, under that field's
name, and :func:`~braid.cli.fields.from_args` picks it up; only the fields made from several
options (or from an option and the environment) are written out here.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from braid.cli.engines import EngineOptions
from braid.cli.environ import API_KEY_ENV, RUNTIME_LORA_ENV
from braid.cli.fields import from_args
from braid.settings import ParserOptions, ServingOptions, Settings
from braid.store.options import StoreOptions, default_storage_dir

if TYPE_CHECKING:
    from braid.http.server import ServerConfig


def api_keys(args: argparse.Namespace, env: Mapping[str, str]) -> tuple[str, ...]:
    """Every key from --api-key, --api-key-file and ``BRAID_API_KEY``; ValueError for a set but
    empty variable (e.g. a compose file's unset ``${KEY}``), which would otherwise leave the
    server open."""
    keys = [*args.api_key, *(key for keys in args.api_key_file for key in keys)]
    if API_KEY_ENV in env:
        if not env[API_KEY_ENV].strip():
            raise ValueError(f"{API_KEY_ENV} is set but empty")
        keys.append(env[API_KEY_ENV].strip())
    return tuple(keys)


def settings_from(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> Settings:
    """The front end's settings from ``braid serve``'s flags and ``env`` (default: the process's);
    ValueError for a value the settings refuse."""
    background = tuple(key for keys in args.background_api_key_file for key in keys)
    env = os.environ if env is None else env
    keys = api_keys(args, env)
    return from_args(
        Settings,
        args,
        api_keys=keys + tuple(k for k in background if k not in keys),
        background_keys=background,
        parsers=from_args(ParserOptions, args),
        # vLLM's variable, read as vLLM reads it, turns the routes on as the flag does
        runtime_lora_updating=args.runtime_lora_updating
        or env.get(RUNTIME_LORA_ENV, "0").strip().lower() in ("1", "true"),
        serving=from_args(ServingOptions, args),
    )


def server_config_from(args: argparse.Namespace) -> ServerConfig:
    """The server's options from ``braid serve``'s flags; ValueError for a value it refuses."""
    from braid.http.server import ServerConfig  # imports quart: never at module level (braid.cli.main)

    return from_args(
        ServerConfig,
        args,
        fast_send=not args.stock_send,
        # One timeout for a client that reads nothing, unless the connection's is set apart.
        write_timeout=args.write_timeout or args.stall_timeout,
    )


def store_options_from(args: argparse.Namespace) -> StoreOptions:
    """The store's options from ``braid serve``'s flags (the directory's default is the user's data directory)."""
    return from_args(StoreOptions, args, storage_dir=args.storage_dir or default_storage_dir())


def engine_options_from(args: argparse.Namespace) -> EngineOptions:
    """The engine's options from ``braid serve``'s flags (the reserve is admission's)."""
    return from_args(EngineOptions, args)


__all__ = ["api_keys", "engine_options_from", "server_config_from", "settings_from", "store_options_from"]
