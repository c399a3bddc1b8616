"""``braid serve``: the command-line entry point.

``--engine auto`` (the default) drives vLLM when it is installed and the scripted engine
otherwise. With vLLM and no ``--model``, braid builds its default tiny model once (see
:mod:`braid.models.tiny`) and serves it.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import logging
import os
import socket
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs
import trio

from braid.engine.base import Engine
from braid.engine.scripted import ScriptedEngine
from braid.engine.vllm_common import check_engine_args
from braid.logs import LOG_FORMATS
from braid.logs import configure as configure_logs
from braid.settings import Settings
from braid.stream.admit import default_reserve

if TYPE_CHECKING:
    from braid.http.server import ServerConfig

# Nothing here imports quart at module level: vLLM's engine process is started with "spawn",
# which re-imports this module, and vLLM's CPU kernel set-up calls hasattr() on every module
# global, which quart's request/app proxies answer with RuntimeError outside a request.

log = logging.getLogger("braid")


def _engine_arg(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key.replace("-", "_"), json.loads(value)
    except json.JSONDecodeError:
        return key.replace("-", "_"), value


DEFAULTS = Settings()
"""The front end's defaults, as :class:`~braid.settings.Settings` declares them."""


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, not {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, not {text}")
    return value


API_KEY_ENV = "BRAID_API_KEY"
"""An API key from the environment: unlike --api-key, not visible in ``ps``."""


def _key_file(path: str) -> list[str]:
    from braid.http.auth import parse_key_file

    try:
        with open(path, encoding="utf-8") as f:
            keys = parse_key_file(f.read())
    except (OSError, UnicodeDecodeError) as exc:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {exc}") from None
    if not keys:
        # An empty file must not leave the server open when its owner meant to close it.
        raise argparse.ArgumentTypeError(f"no keys in {path}")
    return keys


def _allowed_peers(text: str) -> tuple[str, ...]:
    from braid.http.forwarded import parse_allowed  # no quart

    try:
        return parse_allowed(part for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parser(env: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """``braid``'s parser. With ``env`` (``main`` passes ``os.environ``), every ``serve`` option
    ``--some-flag`` takes its default from ``BRAID_SOME_FLAG`` when that is set: see
    :func:`_env_defaults`. ``--help`` shows each option's default and variable."""
    from braid.http.server import ServerConfig  # imports quart: never at module level (see above)

    p = argparse.ArgumentParser(prog="braid", description="Batched OpenAI-compatible completions on Trio.")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve the OpenAI-compatible API")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument(
        "--engine",
        choices=["auto", "vllm", "scripted"],
        default="auto",
        help="auto: vLLM when installed, else the scripted engine",
    )
    s.add_argument("--token-delay", type=float, default=0.0, help="scripted engine: seconds per token")
    e = s.add_argument_group("vLLM engine")
    e.add_argument("--model", default=None, help="model path or name; none: braid's tiny local model")
    e.add_argument("--served-model-name", default=None)
    e.add_argument("--dtype", default=None)
    e.add_argument("--max-model-len", type=int, default=None)
    e.add_argument("--max-num-seqs", type=int, default=None)
    e.add_argument("--tensor-parallel-size", type=int, default=None)
    e.add_argument("--distributed-executor-backend", default=None, help="e.g. mp or ray (multi-GPU, multi-node)")
    e.add_argument("--seed", type=int, default=None)
    e.add_argument(
        "--engine-arg",
        type=_engine_arg,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other AsyncEngineArgs field; VALUE is JSON or a string (repeatable)",
    )
    e.add_argument(
        "--engine-client",
        choices=["trio", "asyncio"],
        default="trio",
        help="trio: drive vLLM's engine core from braid's own thread (braid.engine.vllm_core); "
        "asyncio: vLLM's AsyncLLM on a second thread, through the asyncio bridge",
    )
    e.add_argument(
        "--fault-hooks", action="store_true", help="tests only: a prompt holding 'braid:fail@S' fails after S tokens"
    )
    h = s.add_argument_group("front end")
    h.add_argument("--max-prompts", type=int, default=DEFAULTS.max_prompts, help="prompts per request")
    h.add_argument("--max-choices", type=int, default=DEFAULTS.max_choices, help="prompts x n per request")
    h.add_argument(
        "--max-body-bytes",
        type=_positive_int,
        default=DEFAULTS.max_body_bytes,
        help="413 for a larger request body, refused as it is read (declared or sent)",
    )
    h.add_argument(
        "--body-timeout",
        type=_positive,
        default=DEFAULTS.body_timeout,
        help="408 for a request body not all received this many seconds after braid starts reading it",
    )
    h.add_argument(
        "--max-header-bytes",
        type=_positive_int,
        default=DEFAULTS.max_header_bytes,
        help="hypercorn's 431 for a larger unfinished request header block (HTTP/1.1; HTTP/2 keeps h2's 64 KiB)",
    )
    h.add_argument(
        "--stall-timeout",
        type=_positive,
        default=DEFAULTS.stall_timeout,
        help="abort a stream when its client has taken none of braid's output for this long "
        "(seconds): the engine's buffer for the stream stayed full, so a reader too slow to take "
        f"one chunk (up to {DEFAULTS.buffer} events) in this time is cut",
    )
    h.add_argument(
        "--heartbeat", type=_positive, default=DEFAULTS.heartbeat, help="SSE comment after this many idle seconds"
    )
    k = s.add_argument_group("access (braid.http.auth, braid.http.cors)")
    k.add_argument(
        "--api-key",
        action="append",
        default=[],
        metavar="KEY",
        help=f"require 'Authorization: Bearer KEY' on every route but GET /health (repeatable; "
        f"visible in ps: prefer --api-key-file or {API_KEY_ENV})",
    )
    k.add_argument(
        "--api-key-file",
        type=_key_file,
        action="append",
        default=[],
        metavar="PATH",
        help="API keys, one per line; blank lines and lines starting with # are skipped (repeatable)",
    )
    k.add_argument("--metrics-public", action="store_true", help="with API keys: leave GET /metrics open")
    k.add_argument(
        "--trust-request-chat-template",
        action="store_true",
        help="let a chat request bring its own chat_template (jinja, rendered sandboxed), as vLLM's flag",
    )
    k.add_argument(
        "--allowed-origins",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="enable CORS for this origin, e.g. https://app.example, or * for any (repeatable; default: no CORS)",
    )
    g = s.add_argument_group("logs (braid.logs, braid.http.access_log)")
    g.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="text",
        help="text: readable lines; json: one JSON object per line (time, level, logger, message, "
        "exception), for a log agent",
    )
    g.add_argument(
        "--access-log",
        action="store_true",
        help="one line per HTTP request on stdout: remote address, method, path, status, bytes, "
        "duration, request id, user agent (the rest of the log goes to stderr)",
    )
    g.add_argument(
        "--forwarded-allow-ips",
        type=_allowed_peers,
        default=(),
        metavar="IPS",
        help="comma-separated addresses or networks of proxies whose X-Forwarded-For and "
        "X-Forwarded-Proto braid trusts, or * for any peer; other peers' are ignored",
    )
    a = s.add_argument_group("admission (docs/admission.md)")
    a.add_argument(
        "--max-in-flight-requests",
        type=int,
        default=DEFAULTS.max_in_flight,
        metavar="N",
        help="engine requests in the engine at once, server wide; a prompt with n choices takes n "
        "(none: the engine's own running cap, vLLM's max_num_seqs plus the reserve; 0: unbounded)",
    )
    a.add_argument(
        "--max-queued-requests",
        type=int,
        default=DEFAULTS.max_queued,
        metavar="Q",
        help="requests that may wait for their first engine slot; more get 429 with Retry-After",
    )
    a.add_argument(
        "--admission-reserve",
        type=int,
        default=DEFAULTS.reserve,
        metavar="R",
        help="engine slots kept for requests holding none, so a newcomer starts at the engine's "
        "next step while a large batch runs; with vLLM the engine's running cap is raised by R "
        "(none: a sixteenth of max_num_seqs, at least 1)",
    )
    a.add_argument(
        "--request-timeout",
        type=_positive,
        default=DEFAULTS.request_timeout,
        metavar="SECONDS",
        help="abort a request this long after it arrived, queue wait included",
    )
    h.add_argument(
        "--enable-prompt-tokens-details",
        action="store_true",
        help="usage reports prompt_tokens_details.cached_tokens: the prompt tokens found in the "
        "engine's prefix cache, summed over a batch's prompts",
    )
    h.add_argument("--graceful-timeout", type=float, default=10.0, help="drain time after SIGTERM (seconds)")
    h.add_argument(
        "--write-timeout",
        type=_positive,
        default=None,
        metavar="SECONDS",
        help="reset a connection whose client takes less than 16 KiB of a response in this long "
        "(braid.http.patches.write_deadline); default: the stall timeout",
    )
    h.add_argument(
        "--backlog",
        type=int,
        default=attrs.fields(ServerConfig).backlog.default,
        help="listen queue length (capped by net.core.somaxconn)",
    )
    h.add_argument(
        "--accept-batch",
        type=int,
        default=attrs.fields(ServerConfig).accept_batch.default,
        help="connections one turn of the accept loop takes (braid.http.patches.accept); 1: trio's own, "
        "one per scheduler round (for comparison)",
    )
    h.add_argument("--keep-alive", type=float, default=75.0, help="idle keep-alive timeout (seconds)")
    h.add_argument(
        "--switch-interval",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how long a thread may hold the GIL while another waits for it (sys.setswitchinterval); "
        "default 0.001 with --engine-client asyncio, whose output handler runs on a second thread, "
        "Python's 0.005 otherwise",
    )
    h.add_argument(
        "--stock-send",
        action="store_true",
        help="send every response chunk through hypercorn's own locked path, not braid's "
        "direct socket write (see braid.http.patches.fast_send; for comparison)",
    )
    _env_defaults(s, env)
    return p


_ENV_SKIPPED = {"help", "api_key"}
"""Options without a variable of their own: the keys' is BRAID_API_KEY, read by :func:`settings_from`
(one key; a file of keys with --api-key-file)."""
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off", ""}


def env_name(action: argparse.Action) -> str:
    return "BRAID_" + action.dest.upper()


def _env_defaults(parser: argparse.ArgumentParser, env: Mapping[str, str] | None) -> None:
    """Defaults from the environment, and each option's default and variable in ``--help``.

    A flag on the command line wins over its variable. A variable is read as the flag's value
    would be (its type and choices; a switch takes 1/true/yes/on or 0/false/no/off; a repeatable
    option takes several values separated by spaces); a bad value stops braid with a message
    naming the variable, as a bad flag would. Keys in variables are what this is for: a key on
    the command line is visible to everyone who can run ``ps``."""
    for action in parser._actions:
        if not action.option_strings or action.dest in _ENV_SKIPPED:
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


# Engine sizing for the tiny default model on a 2-core CPU machine. The parity tier and the
# benchmarks start vLLM's own server with exactly these, so both front ends drive the same engine.
TINY_MODEL_ENGINE_ARGS: dict[str, Any] = {"max_model_len": 1024, "max_num_seqs": 64, "max_num_batched_tokens": 2048}


def _vllm_kwargs(args: argparse.Namespace, default_model: bool) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    if default_model:
        kwargs.update(TINY_MODEL_ENGINE_ARGS)
    for name in (
        "dtype",
        "max_model_len",
        "max_num_seqs",
        "tensor_parallel_size",
        "distributed_executor_backend",
        "seed",
    ):
        value = getattr(args, name)
        if value is not None:
            kwargs[name] = value
    kwargs.update(dict(args.engine_arg))
    return kwargs


def _extra_seqs(reserve: int | None) -> Callable[[int], int]:
    """Room for admission's reserve on top of the engine's running cap (braid.stream.admit)."""
    if reserve is not None:
        return lambda _seqs: reserve
    return default_reserve


@asynccontextmanager
async def open_engine(args: argparse.Namespace) -> AsyncIterator[Engine]:
    kind = args.engine
    if kind == "auto":
        kind = "vllm" if importlib.util.find_spec("vllm") is not None else "scripted"
    if kind == "scripted":
        scripted = ScriptedEngine(token_delay=args.token_delay)
        if args.served_model_name or args.max_model_len:
            scripted.info = attrs.evolve(
                scripted.info,
                name=args.served_model_name or scripted.info.name,
                max_model_len=args.max_model_len or scripted.info.max_model_len,
            )
        yield scripted
        return
    from braid.engine.vllm import open_vllm_engine

    model = args.model
    if model is None:
        from braid.models import tiny

        log.info("no --model: using braid's tiny local model (built once, then cached)")
        model = str(await trio.to_thread.run_sync(lambda: tiny.build(tiny.default_dir())))
    async with open_vllm_engine(
        model,
        served_model_name=args.served_model_name or ("braid-tiny" if args.model is None else None),
        engine_kwargs=_vllm_kwargs(args, default_model=args.model is None),
        fault_hooks=args.fault_hooks,
        client=args.engine_client,
        extra_seqs=_extra_seqs(args.admission_reserve),
    ) as engine:
        yield engine


def _freeze_startup_heap() -> None:
    """Move everything alive after start-up (vLLM, torch, the tokenizer: millions of objects)
    out of the cyclic collector's sight. Otherwise every full collection walks them all, a
    pause of up to seconds on the thread that serves streams and handles disconnects; vLLM's
    own server does the same after its start-up."""
    gc.collect()
    gc.freeze()


def _runs_asyncllm(engine: object) -> bool:
    from braid.engine.vllm import VllmEngine  # imports no vLLM

    return isinstance(engine, VllmEngine)


def _set_switch_interval(seconds: float | None, *, two_threads: bool) -> None:
    """With vLLM, braid's Trio thread and its asyncio thread (vLLM's output handler) both want the
    GIL. A thread that returns from a syscall (a socket send, the wake-up of the other thread)
    waits for it until the holder lets go, at most one switch interval. A client disconnect
    becomes an abort, a call from the Trio thread onto the asyncio loop with several such waits
    on the way, so with Python's default interval an abort reached the engine several intervals
    late. A shorter interval shortens each wait, and its cost in throughput was inside the
    run-to-run noise (docs/performance.md, round 2)."""
    if seconds is None and two_threads:
        seconds = 0.001
    if seconds is not None:
        sys.setswitchinterval(seconds)


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
    """The front end's settings from ``braid serve``'s flags and ``env`` (default: the process's)."""
    return Settings(
        max_prompts=args.max_prompts,
        max_choices=args.max_choices,
        max_body_bytes=args.max_body_bytes,
        body_timeout=args.body_timeout,
        max_header_bytes=args.max_header_bytes,
        stall_timeout=args.stall_timeout,
        heartbeat=args.heartbeat,
        prompt_tokens_details=args.enable_prompt_tokens_details,
        max_in_flight=args.max_in_flight_requests,
        max_queued=args.max_queued_requests,
        reserve=args.admission_reserve,
        request_timeout=args.request_timeout,
        api_keys=api_keys(args, os.environ if env is None else env),
        metrics_public=args.metrics_public,
        trust_request_chat_template=args.trust_request_chat_template,
        allowed_origins=args.allowed_origins,
        access_log=args.access_log,
        forwarded_allow_ips=args.forwarded_allow_ips,
    )


def _server_config(args: argparse.Namespace) -> ServerConfig:
    from braid.http.server import ServerConfig  # imports quart: never at module level

    return ServerConfig(
        args.host,
        args.port,
        args.graceful_timeout,
        args.keep_alive,
        fast_send=not args.stock_send,
        # One timeout for a client that reads nothing, unless the connection's is set apart.
        write_timeout=args.write_timeout or args.stall_timeout,
        backlog=args.backlog,
        accept_batch=args.accept_batch,
    )


def main(argv: list[str] | None = None) -> int:
    from braid.http.app import create_app
    from braid.http.server import serve

    parser = _parser(os.environ)
    args = parser.parse_args(argv)
    try:
        # before the default model is built or any engine starts
        check_engine_args(_vllm_kwargs(args, default_model=args.model is None))
    except ValueError as exc:
        parser.error(str(exc))
    try:
        settings = settings_from(args)
    except ValueError as exc:
        parser.error(str(exc))
    configure_logs(args.log_format)
    if settings.api_keys:
        log.info("API keys: %d; open without one: %s", len(settings.api_keys), settings.open_paths)
    cfg = _server_config(args)

    try:
        # Before the engine starts (which takes a while): the common mistakes, one line each.
        _check_model_path(args.model)
        _check_port_free(args.host, args.port)
    except StartupError as exc:
        print(f"braid: {exc}", file=sys.stderr)
        return 1
    serving = False

    async def run() -> None:
        nonlocal serving
        async with open_engine(args) as engine:
            app = create_app(engine, settings)
            _freeze_startup_heap()
            _set_switch_interval(args.switch_interval, two_threads=_runs_asyncllm(engine))

            async def announce(task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
                await serve(app, cfg, task_status=task_status)

            async with trio.open_nursery() as nursery:
                urls = await nursery.start(announce)
                serving = True
                log.info("braid serving %s on %s", engine.info.name, ", ".join(urls))

    try:
        trio.run(run)
    except BaseException as exc:
        if serving or isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        # Before braid served anything, a failure is the operator's to fix (a model that does not
        # load, a port taken meanwhile, an engine that fails to start): one line, not a traceback
        # wrapped in exception groups. The traceback still goes to the log at debug level.
        log.debug("start-up failed", exc_info=exc)
        print(f"braid: could not start: {_one_line(exc)}", file=sys.stderr)
        return 1
    return 0


class StartupError(Exception):
    """A start-up problem braid can name before starting the engine."""


def _check_model_path(model: str | None) -> None:
    """A model given as a path (not a hub name) must exist: vLLM's answer is a Hugging Face
    validation traceback about repository ids."""
    if model is None:
        return
    looks_like_path = model.startswith((os.sep, ".", "~")) or model.count("/") > 1
    if looks_like_path and not os.path.exists(os.path.expanduser(model)):
        raise StartupError(f"no model at {model}: no such file or directory")


def _check_port_free(host: str, port: int) -> None:
    """Bind and release the address, as hypercorn will bind it (``SO_REUSEADDR``)."""
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


def _one_line(exc: BaseException) -> str:
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


if __name__ == "__main__":
    sys.exit(main())
