"""``braid``: the console entry point, :func:`main`, and the ``serve`` command it dispatches to.

The command line's other jobs each have a module of their own in :mod:`braid.cli`:
:mod:`~braid.cli.parser` declares the sub-commands and their options,
:mod:`~braid.cli.environ` reads their ``BRAID_*`` variables, :mod:`~braid.cli.argtypes` their
values, :mod:`~braid.cli.config` turns the parsed arguments into ``Settings``, ``ServerConfig``
and :class:`~braid.cli.engines.EngineOptions`, :mod:`~braid.cli.engines` starts the engine and
tunes the process around it, and :mod:`~braid.cli.startup` names start-up problems in one line.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable

import attrs
import trio

from braid.cli.config import engine_options_from, server_config_from, settings_from, store_options_from
from braid.cli.engines import freeze_startup_heap, open_engine, runs_asyncllm, set_switch_interval
from braid.cli.parser import build_parser
from braid.cli.startup import StartupError, check_model_path, check_parsers, check_port_free, check_vllm, one_line
from braid.engine.vllm_common import check_engine_args
from braid.logs import configure as configure_logs

# Nothing here imports quart at module level: vLLM's engine process is started with "spawn",
# which re-imports this module, and vLLM's CPU kernel set-up calls hasattr() on every module
# global, which quart's request/app proxies answer with RuntimeError outside a request.

log = logging.getLogger("braid")

Command = Callable[[argparse.ArgumentParser, argparse.Namespace], int]


def main(argv: list[str] | None = None) -> int:
    """Run the sub-command ``argv`` (default: the process's arguments) names; its exit status.
    A usage error (a bad flag, variable or value) exits with status 2, as argparse's do."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["batch"]:
        # Its own parser: `braid batch`'s flags, then any `braid serve` option (braid.cli.batch).
        from braid.cli.batch import batch

        return batch(argv[1:])
    parser = build_parser(os.environ)
    args = parser.parse_args(argv)
    command: Command = {"serve": serve}[args.command]
    return command(parser, args)


def serve(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``braid serve``: start the engine, serve until SIGTERM/SIGINT, drain, exit 0. A problem
    before anything is served is one line on stderr and status 1, not a traceback."""
    from braid.http.app import create_app
    from braid.http.server import serve as serve_http

    try:
        engine_options = engine_options_from(args)
        # before the default model is built or any engine starts
        check_engine_args(engine_options.vllm_kwargs())
        settings = settings_from(args)
        if settings.parsers.reasoning_parser is not None:
            # As vLLM's server: the engine's structured output waits for the end of the
            # reasoning, which its copy of the reasoning parser finds (an --engine-arg wins).
            reasoning = ("reasoning_parser", settings.parsers.reasoning_parser)
            engine_options = attrs.evolve(engine_options, engine_args=(reasoning, *engine_options.engine_args))
        cfg = server_config_from(args)
        store_options = store_options_from(args)
    except ValueError as exc:
        parser.error(str(exc))
    configure_logs(args.log_format)
    if settings.api_keys:
        log.info("API keys: %d; open without one: %s", len(settings.api_keys), settings.open_paths)

    try:
        # Before the engine starts (which takes a while): the common mistakes, one line each.
        check_vllm(engine_options.engine)
        check_model_path(engine_options.model)
        check_port_free(cfg.host, cfg.port)
        check_parsers(settings.parsers)
    except StartupError as exc:
        print(f"braid: {exc}", file=sys.stderr)
        return 1
    serving = False

    async def run() -> None:
        nonlocal serving
        from braid.store.db import open_store

        # The store first: a storage directory braid cannot use fails before the engine's slow start.
        async with open_store(store_options, int(time.time())) as store, open_engine(engine_options) as engine:
            app = create_app(engine, settings, store=store)
            freeze_startup_heap()
            set_switch_interval(engine_options.switch_interval, two_threads=runs_asyncllm(engine))

            async with trio.open_nursery() as nursery:

                async def announce(task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
                    await serve_http(app, cfg, task_status=task_status)
                    # drained: the batch runner's lines are over (ended by the drain), so is it
                    nursery.cancel_scope.cancel()

                runner = app.batches
                if runner is not None:
                    await nursery.start(runner.run)
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
        print(f"braid: could not start: {one_line(exc)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
