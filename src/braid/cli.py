"""``braid serve``: the command-line entry point."""

from __future__ import annotations

import argparse
import logging
import sys

import attrs
import trio

from braid.engine.scripted import ScriptedEngine
from braid.http.app import Settings, create_app
from braid.server import ServerConfig, serve


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="braid", description="Batched OpenAI-compatible completions on Trio.")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve the OpenAI-compatible API")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--engine", choices=["scripted"], default="scripted",
                   help="the engine to drive (the vLLM engine comes with its own issue)")
    s.add_argument("--token-delay", type=float, default=0.0, help="scripted engine: seconds per token")
    s.add_argument("--served-model-name", default=None)
    s.add_argument("--max-model-len", type=int, default=None)
    s.add_argument("--max-prompts", type=int, default=1024, help="prompts per request")
    s.add_argument("--max-choices", type=int, default=4096, help="prompts x n per request")
    s.add_argument("--stall-timeout", type=float, default=30.0,
                   help="abort a stream whose client reads nothing for this long (seconds)")
    s.add_argument("--heartbeat", type=float, default=15.0, help="SSE comment after this many idle seconds")
    s.add_argument("--graceful-timeout", type=float, default=10.0, help="drain time after SIGTERM (seconds)")
    s.add_argument("--keep-alive", type=float, default=75.0, help="idle keep-alive timeout (seconds)")
    s.add_argument("--access-log", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    engine = ScriptedEngine(token_delay=args.token_delay)
    if args.served_model_name or args.max_model_len:
        engine.info = attrs.evolve(
            engine.info,
            name=args.served_model_name or engine.info.name,
            max_model_len=args.max_model_len or engine.info.max_model_len,
        )
    settings = Settings(
        max_prompts=args.max_prompts,
        max_choices=args.max_choices,
        stall_timeout=args.stall_timeout,
        heartbeat=args.heartbeat,
    )
    app = create_app(engine, settings)
    cfg = ServerConfig(args.host, args.port, args.graceful_timeout, args.keep_alive, args.access_log)

    async def run() -> None:
        async def announce(task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
            await serve(app, cfg, task_status=task_status)

        async with trio.open_nursery() as nursery:
            urls = await nursery.start(announce)
            logging.getLogger("braid").info("braid serving %s on %s", engine.info.name, ", ".join(urls))

    trio.run(run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
