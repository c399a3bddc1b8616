"""braid (scripted engine, zero token delay) with a counter of ASGI body sends per response.

The same app as ``braid serve --engine scripted --token-delay 0``, built in-process, with one
wrapper around the ASGI callable that counts ``http.response.body`` messages. On SIGTERM/SIGINT
it drains and writes ``{"responses": R, "body_sends": S}`` to the ``--stats`` file. Used for the
profile run (the throughput runs use the plain CLI).

Run: python -m bench.apps.braid_counting --port P --stats FILE
"""

from __future__ import annotations

import argparse
import json

import trio

from braid.engine.scripted import ScriptedEngine
from braid.http.app import BraidApp, create_app
from braid.http.server import ServerConfig, serve
from braid.settings import Settings


class _CountingApp:
    """Forwards to the braid app and counts its body sends; ``state`` is what ``serve`` drains."""

    def __init__(self, app: BraidApp) -> None:
        self.app = app
        self.state = app.state
        self.counts = {"responses": 0, "body_sends": 0}

    async def __call__(self, scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        counts = self.counts

        async def counted_send(message):  # type: ignore[no-untyped-def]
            if message["type"] == "http.response.body":
                counts["body_sends"] += 1
                if not message.get("more_body", False):
                    counts["responses"] += 1
            await send(message)

        return await self.app(scope, receive, counted_send)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--stats", required=True)
    args = p.parse_args()
    app = create_app(ScriptedEngine(token_delay=0.0), Settings())
    counter = _CountingApp(app)

    async def run() -> None:
        await serve(counter, ServerConfig(port=args.port))  # type: ignore[arg-type]
        await trio.Path(args.stats).write_text(json.dumps(counter.counts))

    trio.run(run)


if __name__ == "__main__":
    main()
