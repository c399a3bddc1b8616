"""Micro-benchmark of braid's own per-event work and of one SSE stream over loopback.

Not a test: prints a table. Run: .venv/bin/python bench/stream_core.py
1. core: StreamMerger.feed (render + encode) per event, no I/O.
2. http: one streaming request of P prompts x T tokens to braid on hypercorn (scripted engine at
   zero delay, client and server in one process and one core), events/s and body sends.
"""

from __future__ import annotations

import time
from functools import partial

import httpx
import trio

from braid.engine.base import ChoiceDelta, EngineOutput
from braid.engine.scripted import ScriptedEngine
from braid.http.app import create_app
from braid.http.server import ServerConfig, serve
from braid.routes import completions
from braid.settings import Settings
from braid.stream.plan import make_plan
from braid.wire.completions_request import parse_request
from braid.wire.fields import Limits


def core(prompts: int = 64, tokens: int = 256) -> float:
    engine = ScriptedEngine()
    listed = ",".join(['"p"'] * prompts)
    body = f'{{"prompt": [{listed}], "max_tokens": {tokens}, "stream": true}}'.encode()
    plan = make_plan(
        parse_request(body, Limits(vocab_size=259)), engine.info, engine.tokenizer, request_id="cmpl-b", created=0
    )
    merger = completions.merger(plan, engine.tokenizer)
    ids = plan.items[0].request.prompt_token_ids
    arrivals = [
        [
            (
                p,
                EngineOutput(
                    ids, (ChoiceDelta(0, "x", (100,), None, "length" if t == tokens - 1 else None),), t == tokens - 1
                ),
            )
            for p in range(prompts)
        ]
        for t in range(tokens)
    ]
    start = time.perf_counter()
    size = 0
    for batch in arrivals:
        size += len(merger.feed(batch))
    merger.finish()
    took = time.perf_counter() - start
    n = prompts * tokens
    print(f"core   {n} events in {took * 1000:.1f} ms: {took / n * 1e6:.2f} us/event, {size / n:.0f} B/event")
    return took / n


async def http(prompts: int, tokens: int) -> None:
    engine = ScriptedEngine(token_delay=0.0)
    app = create_app(engine, Settings())
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        (url,) = await nursery.start(partial(serve, app, ServerConfig(port=0), shutdown=shutdown, handle_signals=False))
        body = {"prompt": ["p"] * prompts, "max_tokens": tokens, "ignore_eos": True, "stream": True}
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            start = time.perf_counter()
            reads = 0
            events = 0
            async with client.stream("POST", "/v1/completions", json=body) as r:
                async for raw in r.aiter_raw():
                    reads += 1
                    events += raw.count(b"\n\ndata: ") + 0
            took = time.perf_counter() - start
        n = prompts * tokens
        print(
            f"http   {prompts:4d} prompts x {tokens:4d} tokens: {n / took:9.0f} events/s  ({took * 1000:.0f} ms, {reads} client reads)"
        )
        shutdown.set()


if __name__ == "__main__":
    core()
    for p, t in [(1, 1024), (8, 256), (64, 64), (256, 16)]:
        trio.run(http, p, t)
