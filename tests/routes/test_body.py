"""CompletionStream (src/braid/routes/body.py), driven the way quart drives a response body."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import trio

from braid.engine.base import ChoiceDelta, EngineOutput, EngineRequest
from braid.engine.scripted import ScriptedEngine
from braid.metrics import Metrics
from braid.routes import completions
from braid.routes.body import GATHER_ROUNDS, CompletionStream, _gather
from braid.settings import Settings
from braid.stream.heartbeat import TICK, Heartbeat
from braid.stream.run import CompletionRun
from braid.wire.output import HEARTBEAT
from tests.helpers import parse_sse, plan_for


async def _drain(body: CompletionStream) -> list[bytes]:
    sends = []
    async with body as b:
        async for data in b:
            sends.append(data)
    return sends


async def test_ready_events_are_coalesced_into_one_send() -> None:
    engine = ScriptedEngine(token_delay=0.0)
    plan = plan_for(
        engine,
        b'{"prompt": '
        + str([f"p{i}" for i in range(16)]).replace("'", '"').encode()
        + b', "max_tokens": 16, "ignore_eos": true, "stream": true}',
    )
    body = CompletionStream(
        CompletionRun(engine, plan, Metrics(), Settings(heartbeat=15)), completions.merger(plan, engine.tokenizer)
    )
    sends = await _drain(body)
    events = parse_sse(b"".join(sends))
    assert sum(1 for e in events if isinstance(e, dict)) == 16 * 16
    assert len(sends) < 16 * 16 / 4  # many events per body send under load
    assert events[-1] == "[DONE]"


async def test_a_producer_faster_than_the_sends_is_sent_a_few_events_per_chunk() -> None:
    # One prompt at zero delay makes one token per scheduler round: without gathering, each
    # chunk would carry one event (one body send per token).
    engine = ScriptedEngine(token_delay=0.0)
    plan = plan_for(engine, b'{"prompt": "x", "max_tokens": 64, "ignore_eos": true, "stream": true}')
    body = CompletionStream(
        CompletionRun(engine, plan, Metrics(), Settings(heartbeat=15)), completions.merger(plan, engine.tokenizer)
    )
    sends = await _drain(body)
    per_chunk = [len(parse_sse(s)) for s in sends]
    assert sum(per_chunk) == 64 + 1
    # trio runs each round's tasks in a random order, so a round may end a gathering early:
    # 300 runs took 14 to 25 sends (one event per send would be 65)
    assert len(sends) <= 32
    # what was ready (at most 2), then 1 per round; the last chunk also carries [DONE]
    tokens = [sum(1 for e in parse_sse(s) if e != "[DONE]") for s in sends]
    assert sum(tokens) == 64 and max(tokens) <= GATHER_ROUNDS + 2


class _EndlessRun:
    """A run whose producers always have another output by the next round."""

    def __init__(self) -> None:
        self.takes = 0

    def take_ready(self) -> list[object]:
        self.takes += 1
        return [("arrival", self.takes), TICK]


async def test_gathering_stops_after_its_rounds_even_if_outputs_keep_coming() -> None:
    run = _EndlessRun()
    arrivals: list[object] = [("arrival", 0)]
    with trio.fail_after(5):
        await _gather(run, arrivals)  # type: ignore[arg-type]
    assert arrivals == [("arrival", i) for i in range(GATHER_ROUNDS + 1)]  # ticks dropped


async def test_idle_stream_sends_one_event_per_send(autojump_clock: trio.testing.MockClock) -> None:
    engine = ScriptedEngine(token_delay=1.0)
    plan = plan_for(engine, b'{"prompt": "x", "max_tokens": 5, "ignore_eos": true, "stream": true}')
    body = CompletionStream(
        CompletionRun(engine, plan, Metrics(), Settings(heartbeat=15)), completions.merger(plan, engine.tokenizer)
    )
    sends = await _drain(body)
    # 5 tokens, one per send; [DONE] rides with the last (the stream is over when its choice finishes)
    assert [len(parse_sse(s)) for s in sends] == [1, 1, 1, 1, 2]


async def test_cancelled_body_aborts_and_writes_nothing_more(autojump_clock: trio.testing.MockClock) -> None:
    engine = ScriptedEngine(token_delay=0.1)
    plan = plan_for(engine, b'{"prompt": ["a","b","c"], "max_tokens": 100, "ignore_eos": true, "stream": true}')
    body = CompletionStream(
        CompletionRun(engine, plan, Metrics(), Settings(heartbeat=15)), completions.merger(plan, engine.tokenizer)
    )
    sends: list[bytes] = []
    with trio.move_on_after(1.05):  # a client disconnect reaches the body as cancellation
        async with body as b:
            async for data in b:
                sends.append(data)
    assert engine.in_flight == 0 and engine.aborted_total == 3
    assert b"[DONE]" not in b"".join(sends)


async def test_an_idle_stream_pings_once_per_heartbeat_and_a_stale_tick_is_ignored(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = ScriptedEngine(token_delay=10.0)
    plan = plan_for(engine, b'{"prompt": "x", "max_tokens": 2, "ignore_eos": true, "stream": true}')
    run = CompletionRun(engine, plan, Metrics(), Settings(heartbeat=4))
    body = CompletionStream(run, completions.merger(plan, engine.tokenizer))
    sends: list[tuple[float, bytes]] = []
    async with body as b:
        await trio.testing.wait_all_tasks_blocked()  # the clock has started
        assert run.heartbeat is not None and run.heartbeat._ticks is not None
        run.heartbeat._ticks.send_nowait(TICK)  # a tick no wait asked for: no ping
        async for data in b:
            sends.append((trio.current_time(), data))
    pings = [t for t, data in sends if data == HEARTBEAT]
    # tokens at 10 and 20 s; pings 4 s into each idle wait: 4, 8, then 14, 18 (the wait restarts at 10)
    assert pings == [4, 8, 14, 18]
    assert [t for t, data in sends if data != HEARTBEAT] == [10, 20]  # the last token carries [DONE]


async def test_a_finished_run_stops_its_heartbeat_clock(autojump_clock: trio.testing.MockClock) -> None:
    engine = ScriptedEngine(token_delay=0.0)
    plan = plan_for(engine, b'{"prompt": "x", "max_tokens": 3, "stream": true}')
    body = CompletionStream(
        CompletionRun(engine, plan, Metrics(), Settings(heartbeat=1000)), completions.merger(plan, engine.tokenizer)
    )
    with trio.fail_after(100):  # a clock that outlived the drivers would keep the run open
        await _drain(body)


@attrs.define
class EmptyDeltaEngine(ScriptedEngine):
    """One prompt: an output with nothing in it at 6 s, then one token at 15 s."""

    @asynccontextmanager
    async def open_request(
        self,
        request: EngineRequest,
        on_failure: object = None,
        deliver: object = None,
        observe: object = None,
        ending: object = None,
    ) -> AsyncIterator[AsyncIterator[EngineOutput]]:
        async def outputs() -> AsyncIterator[EngineOutput]:
            await trio.sleep(6)
            yield EngineOutput(request.prompt_token_ids, (ChoiceDelta(0, "", ()),))
            await trio.sleep(9)
            yield EngineOutput(request.prompt_token_ids, (ChoiceDelta(0, "z", (90,), None, "length"),), finished=True)

        yield outputs()


async def test_an_output_that_encodes_to_nothing_does_not_restart_the_heartbeat(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = EmptyDeltaEngine()
    plan = plan_for(engine, b'{"prompt": "x", "max_tokens": 1, "stream": true}')
    merger = completions.merger(plan, engine.tokenizer)
    body = CompletionStream(CompletionRun(engine, plan, Metrics(), Settings(heartbeat=10)), merger)
    sends: list[tuple[float, bytes]] = []
    async with body as b:
        async for data in b:
            sends.append((trio.current_time(), data))
    # idle from 0: the ping is due at 10 s even though an (empty) output came at 6 s
    assert sends[0] == (10, HEARTBEAT)
    assert [t for t, _ in sends[1:]] == [15]  # the token and [DONE], one send


class _TimedArrivals:
    """A run that delivers fixed batches of arrivals at fixed times (no clock task: the ticks are
    in the batches), so a test can put a tick and an output in the same batch."""

    relayed = False  # its arrivals count as the engine's own deliveries: no gathering

    def __init__(self, batches: list[tuple[float, list[object]]], heartbeat: float) -> None:
        self.batches = batches
        self.heartbeat = Heartbeat(heartbeat)

    def take_ready(self) -> list[object]:
        if not self.batches:
            raise trio.EndOfChannel
        when, batch = self.batches[0]
        if trio.current_time() < when:
            return []
        self.batches.pop(0)
        return list(batch)

    async def receive_ready(self) -> list[object]:
        if self.batches:
            await trio.sleep_until(self.batches[0][0])
        return self.take_ready()


async def test_a_tick_that_comes_with_outputs_encoding_to_nothing_still_pings(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The clock ticks once per wait; here its tick and an empty output end the wait together,
    # and the stream must not stay silent until the next token (at 25 s).
    engine = ScriptedEngine()
    plan = plan_for(engine, b'{"prompt": "x", "max_tokens": 1, "stream": true}')
    ids = plan.items[0].request.prompt_token_ids
    empty = (0, EngineOutput(ids, (ChoiceDelta(0, "", ()),)))
    last = (0, EngineOutput(ids, (ChoiceDelta(0, "z", (90,), None, "length"),), finished=True))
    run = _TimedArrivals([(10, [TICK, empty]), (25, [last])], heartbeat=10)
    body = CompletionStream(run, completions.merger(plan, engine.tokenizer))  # type: ignore[arg-type]
    sends = []
    async for data in body:
        sends.append((trio.current_time(), data))
    assert sends[0] == (10, HEARTBEAT)
    # the wait after the ping is a fresh period: 25 s comes before its deadline (20 s is the
    # clock's to tick, and this run has no clock)
    assert [t for t, data in sends[1:]] == [25]  # the token and [DONE], one send
