"""Start-up problems as one line for the operator, not a traceback.

:func:`check_model_path` and :func:`check_port_free` name the common mistakes before the engine
starts (which takes a while); :func:`one_line` names whatever else failed before braid served.
"""

from __future__ import annotations

import os
import socket

from braid.settings import ParserOptions


class StartupError(Exception):
    """A start-up problem braid can name before starting the engine."""


def check_model_path(model: str | None) -> None:
    """A model given as a path (not a hub name) must exist: vLLM's answer is a Hugging Face
    validation traceback about repository ids."""
    if model is None:
        return
    looks_like_path = model.startswith((os.sep, ".", "~")) or model.count("/") > 1
    if looks_like_path and not os.path.exists(os.path.expanduser(model)):
        raise StartupError(f"no model at {model}: no such file or directory")


def check_port_free(host: str, port: int) -> None:
    """Bind and release the address, as hypercorn will bind it (``SO_REUSEADDR``); port 0 (any
    free port) always passes."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise StartupError(f"cannot listen on {host}:{port}: {exc}") from None
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
        except OSError as exc:
            raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def check_vllm(engine: str) -> None:
    """With vLLM's engine (``vllm``, or ``auto`` where vLLM is installed), vLLM must be the release
    braid drives (:data:`braid.engine.vllm_common.VLLM_VERSION`); read from its metadata, so
    nothing of vLLM is imported here."""
    if engine == "scripted":
        return
    from braid.engine.vllm_common import check_vllm_version, installed_vllm_version

    try:
        check_vllm_version(installed_vllm_version())
    except ValueError as exc:
        raise StartupError(str(exc)) from None


def check_parsers(options: ParserOptions) -> None:
    """Tool-call and reasoning parser names vLLM does not have (or flags that go together
    wrongly), named with the valid ones. Imports vLLM's parsers only when a flag names one."""
    if not (options.active or options.enable_auto_tool_choice or options.tool_parser_plugin):
        return
    try:
        from braid.engine.vllm_parsers import ParserConfigError, check_parser_names
    except ImportError as exc:
        raise StartupError(f"tool and reasoning parsers are vLLM's, and vLLM is not installed ({exc})") from None
    try:
        check_parser_names(options)
    except ParserConfigError as exc:
        raise StartupError(str(exc)) from None


def one_line(exc: BaseException) -> str:
    """The innermost real error of ``exc`` (through exception groups and causes), on one line."""
    while True:
        if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
        elif exc.__cause__ is not None:
            exc = exc.__cause__
        else:
            break
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"


__all__ = ["StartupError", "check_model_path", "check_parsers", "check_port_free", "one_line"]
