"""CompletionRun (src/braid/run.py) on the scripted engine, in virtual time."""

from __future__ import annotations

import pytest
import trio

from braid.engine.scripted import ScriptedEngine
from braid.errors import DeadlineExceeded, EngineError, StreamStalled
from braid.metrics import Metrics
from braid.settings import Settings
from braid.stream.admit import Admission
from braid.stream.plan import Plan, make_plan
from braid.stream.run import CompletionRun
from braid.wire.completions_request import parse_request
from braid.wire.fields import Limits
from tests.helpers import aborts, arrivals


def plan_for(engine: ScriptedEngine, body: bytes) -> Plan:
    req = parse_request(body, Limits(vocab_size=engine.info.vocab_size))
    return make_plan(req, engine.info, engine.tokenizer, request_id="cmpl-t", created=0)


PROMPTS = b'["p0","p1","p2 braid:fail@5","p3","p4","p5","p6","p7"]'


async def test_a_failure_aborts_siblings_without_any_consumer(autojump_clock: trio.testing.MockClock) -> None:
    engine = ScriptedEngine(token_delay=0.01)
    plan = plan_for(engine, b'{"prompt": ' + PROMPTS + b', "max_tokens": 1000, "ignore_eos": true}')
    run = CompletionRun(engine, plan, Metrics(), Settings(buffer=1024, stall_timeout=1000))
    async with run:
        # Nobody reads: the siblings must be aborted by the failing driver itself.
        await trio.sleep(1)
        assert engine.failed_total == 1 and engine.in_flight == 0 and engine.aborted_total == 7
        assert isinstance(run.error, EngineError)
        # one batch abort of the siblings still open, asked for by the failing driver (its own
        # request is one the engine ended, and may or may not still be open then)
        assert len(engine.batch_aborts) == 1
        assert {f"cmpl-t-{i}" for i in range(8) if i != 2} <= set(engine.batch_aborts[0])
        with pytest.raises(EngineError):
            await run.receive_ready()


async def test_cancelling_the_run_aborts_every_request_once(autojump_clock: trio.testing.MockClock) -> None:
    engine = ScriptedEngine(token_delay=0.01)
    plan = plan_for(engine, b'{"prompt": ["a","b","c","d"], "n": 2, "max_tokens": 1000, "ignore_eos": true}')
    metrics = Metrics()
    with trio.move_on_after(0.5):
        async with CompletionRun(engine, plan, metrics) as run:
            while True:
                await run.receive_ready()
    assert engine.in_flight == 0
    assert sorted(engine.aborted_ids) == [f"cmpl-t-{i}" for i in range(4)]
    assert engine.batch_aborts == [tuple(f"cmpl-t-{i}" for i in range(4))]  # one call, before the drivers unwound
    assert aborts(metrics.registry) == {"disconnect": 4}
    assert metrics.registry.get_sample_value("braid_engine_requests_in_flight") == 0


async def test_a_stalled_consumer_fails_the_run_after_the_stall_timeout(autojump_clock: trio.testing.MockClock) -> None:
    engine = ScriptedEngine(token_delay=0.0)
    plan = plan_for(engine, b'{"prompt": ["a","b"], "max_tokens": 1000, "ignore_eos": true, "stream": true}')
    run = CompletionRun(engine, plan, Metrics(), Settings(buffer=4, stall_timeout=2.0))
    async with run:
        await trio.sleep(1.9)
        assert engine.in_flight == 2  # blocked on the full buffer, not yet stalled
        await trio.sleep(0.2)
        assert engine.in_flight == 0 and engine.aborted_total == 2
        with pytest.raises(StreamStalled):
            await run.receive_ready()


async def test_receive_ready_takes_everything_ready_at_once() -> None:
    engine = ScriptedEngine(token_delay=0.0)
    plan = plan_for(engine, b'{"prompt": ["a","b","c","d"], "max_tokens": 8, "ignore_eos": true, "stream": true}')
    sizes = []
    async with CompletionRun(engine, plan, Metrics(), Settings(buffer=64)) as run:
        await trio.testing.wait_all_tasks_blocked()
        while True:
            try:
                sizes.append(len(await run.receive_ready()))
            except trio.EndOfChannel:
                break
    assert sum(sizes) == 4 * 8
    assert max(sizes) > 1 and len(sizes) < 32


async def test_a_finished_run_leaves_no_request_behind() -> None:
    engine = ScriptedEngine(token_delay=0.0)
    plan = plan_for(engine, b'{"prompt": ["a","b","c"], "n": 3, "max_tokens": 5}')
    metrics = Metrics()
    async with CompletionRun(engine, plan, metrics) as run:
        while True:
            try:
                await run.receive_ready()
            except trio.EndOfChannel:
                break
    assert engine.finished_total == 3 and engine.aborted_total == 0 and engine.in_flight == 0
    assert engine.batch_aborts == []
    assert aborts(metrics.registry) == {}


async def test_a_large_batch_opens_its_requests_a_chunk_per_scheduler_round(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from braid.stream.run import START_CHUNK

    engine = ScriptedEngine(token_delay=1.0)
    count = 4 * START_CHUNK
    prompts = ",".join(f'"p{i}"' for i in range(count)).encode()
    plan = plan_for(engine, b'{"prompt": [' + prompts + b'], "max_tokens": 1000, "ignore_eos": true}')
    seen = []

    async def other_stream() -> None:
        # Runs once per scheduler round, as another stream's task would.
        while engine.in_flight < count:
            seen.append(engine.in_flight)
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other_stream)
        async with CompletionRun(engine, plan, Metrics()) as run:
            await trio.sleep(0.5)
            assert engine.in_flight == count
            run.abort_all(EngineError("done"))
    # Between two of its turns at most two chunks opened (the rest of one round, the start of
    # the next), never the whole batch at once.
    assert seen[0] == 0 and max(b - a for a, b in zip(seen, [*seen[1:], count], strict=False)) <= 2 * START_CHUNK


async def test_drivers_that_run_after_the_run_is_cancelled_open_nothing(autojump_clock: trio.testing.MockClock) -> None:
    from braid.stream.run import START_CHUNK

    engine = ScriptedEngine(token_delay=1.0)
    count = 3 * START_CHUNK
    prompts = ",".join(f'"p{i}"' for i in range(count)).encode()
    plan = plan_for(engine, b'{"prompt": [' + prompts + b'], "max_tokens": 1000, "ignore_eos": true}')
    metrics = Metrics()
    run = CompletionRun(engine, plan, metrics)

    def opened() -> float:
        return metrics.registry.get_sample_value("braid_engine_requests_total") or 0.0

    async with run:
        run.abort_all(EngineError("at once"))  # some of the first chunk's drivers may have run
        before = opened()
    assert before <= START_CHUNK and opened() == before  # none opened after the abort
    assert engine.in_flight == 0 and engine.finished_total == 0


async def test_a_failure_aborts_siblings_while_every_driver_is_blocked(autojump_clock: trio.testing.MockClock) -> None:
    """The client reads nothing and every driver waits on the full channel: the engine's report of
    the failure (not the failing driver's next read) aborts the batch, at the failure's instant."""
    engine = ScriptedEngine(token_delay=0.01)
    plan = plan_for(engine, b'{"prompt": ' + PROMPTS + b', "max_tokens": 1000, "ignore_eos": true, "stream": true}')
    metrics = Metrics()
    failed_at: list[float] = []
    run = CompletionRun(engine, plan, metrics, Settings(buffer=1, stall_timeout=1000))
    async with run:
        with trio.fail_after(5):  # virtual seconds; prompt 2 fails at its 6th token, t = 0.06
            await engine.wait_until(lambda: engine.failed_total > 0)
        failed_at.append(trio.current_time())
        await trio.testing.wait_all_tasks_blocked()
        # every driver was blocked long before prompt 2 failed (the channel holds one output)
        assert failed_at[0] == pytest.approx(0.06, abs=0.002)
        assert engine.in_flight == 0 and engine.aborted_total == 7
        assert trio.current_time() == failed_at[0]  # no virtual time passed
        assert isinstance(run.error, EngineError)
    assert metrics.registry.get_sample_value("braid_engine_errors_total") == 1
    assert aborts(metrics.registry) == {"error": 7}


async def test_leaving_a_failed_run_raises_its_error_not_a_group() -> None:
    engine = ScriptedEngine(token_delay=0.0)
    plan = plan_for(engine, b'{"prompt": ["a", "b braid:fail@2"], "max_tokens": 50, "ignore_eos": true}')
    with pytest.raises(EngineError, match="braid:fail@2"):  # pytest.raises does not look into groups
        async with CompletionRun(engine, plan, Metrics()) as run:
            while True:
                await run.receive_ready()


async def test_a_cancelled_run_is_caught_by_its_own_scope(autojump_clock: trio.testing.MockClock) -> None:
    engine = ScriptedEngine(token_delay=0.5)
    plan = plan_for(engine, b'{"prompt": ["a", "b"], "max_tokens": 50, "ignore_eos": true, "stream": true}')
    with trio.move_on_after(1) as scope:
        async with CompletionRun(engine, plan, Metrics()) as run:
            while True:
                await run.receive_ready()
    assert scope.cancelled_caught and engine.aborted_total == 2


async def _drain(run: CompletionRun) -> list:  # type: ignore[type-arg]
    got = []
    while True:
        try:
            got.extend(await run.receive_ready())
        except trio.EndOfChannel:
            return got


async def _first_outputs(engine: ScriptedEngine, run: CompletionRun) -> tuple[dict[int, float], int]:
    """Run ``run`` to its end: when each prompt's first output came, and the most engine
    requests in flight at once (sampled every 10 ms)."""
    first: dict[int, float] = {}
    most = 0

    async def watch() -> None:
        nonlocal most
        while True:
            most = max(most, engine.in_flight)
            await trio.sleep(0.01)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        async with run:
            while True:
                try:
                    for idx, _ in arrivals(await run.receive_ready()):
                        first.setdefault(idx, trio.current_time())
                except trio.EndOfChannel:
                    break
        nursery.cancel_scope.cancel()
    return first, most


async def test_a_batch_larger_than_the_slots_starts_progressively_in_prompt_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = ScriptedEngine(token_delay=0.1)
    prompts = ",".join(f'"p{i}"' for i in range(10)).encode()
    plan = plan_for(engine, b'{"prompt": [' + prompts + b'], "n": 2, "max_tokens": 3, "ignore_eos": true}')
    adm = Admission(slots=6)
    first, peak = await _first_outputs(engine, CompletionRun(engine, plan, Metrics(), ticket=adm.admit()))
    assert peak == 3  # n=2: three prompts' six slots
    # In prompt order, three at a time as slots free up.
    waves = sorted(set(first.values()))
    assert [waves.index(first[i]) for i in range(10)] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]
    assert engine.finished_total == 10 and engine.aborted_total == 0
    assert (adm.in_use, adm.queued, adm.waiting) == (0, 0, 0)


@pytest.mark.parametrize(
    ("lead", "starts", "peak"),
    [
        # p0's 3rd of 5 tokens comes at 0.3 s: p1 opens then, its first token 0.1 s later
        (2, [0.1, 0.4, 0.7], 2),
        (0, [0.1, 0.6, 1.1], 1),  # each prompt waits for the last token of the one before
        (9, [0.1, 0.2, 0.3], 3),  # more than max_tokens: handed on at the first token
    ],
)
async def test_a_prompt_near_its_end_hands_its_slots_to_the_next(
    autojump_clock: trio.testing.MockClock, lead: int, starts: list[float], peak: int
) -> None:
    engine = ScriptedEngine(token_delay=0.1)
    plan = plan_for(engine, b'{"prompt": ["a","b","c"], "max_tokens": 5, "ignore_eos": true, "stream": true}')
    adm = Admission(slots=1)
    run = CompletionRun(engine, plan, Metrics(), Settings(handover_tokens=lead), ticket=adm.admit())
    first, most = await _first_outputs(engine, run)
    assert [first[i] for i in range(3)] == pytest.approx(starts)
    assert most == peak
    assert engine.finished_total == 3 and engine.aborted_total == 0
    assert (adm.in_use, adm.queued, adm.waiting) == (0, 0, 0)


async def test_a_run_cancelled_while_prompts_are_queued_leaves_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = ScriptedEngine(token_delay=0.1)
    adm = Admission(slots=2)
    other = adm.admit()
    await other.acquire(1)  # another request holds a slot throughout
    plan = plan_for(engine, b'{"prompt": ["a","b","c","d"], "max_tokens": 1000, "ignore_eos": true}')
    with trio.move_on_after(0.5):
        async with CompletionRun(engine, plan, Metrics(), ticket=adm.admit()) as run:
            await _drain(run)
    assert engine.in_flight == 0
    assert sorted(engine.aborted_ids) == ["cmpl-t-0"]  # the only prompt that got a slot
    assert (adm.in_use, adm.queued, adm.waiting) == (1, 0, 0)
    other.close()
    assert adm.in_use == 0


async def test_the_deadline_aborts_the_run_queue_wait_included(autojump_clock: trio.testing.MockClock) -> None:
    engine = ScriptedEngine(token_delay=0.1)
    adm = Admission(slots=1)
    plan = plan_for(engine, b'{"prompt": ["a","b"], "max_tokens": 1000, "ignore_eos": true}')
    settings = Settings(request_timeout=2.0)
    async with CompletionRun(
        engine, plan, Metrics(), settings, ticket=adm.admit(), deadline=trio.current_time() + 2.0
    ) as run:
        with pytest.raises(DeadlineExceeded):
            await _drain(run)
        assert trio.current_time() == pytest.approx(2.0)
    assert engine.in_flight == 0 and engine.aborted_ids == ["cmpl-t-0"]  # "b" never got the slot
    assert (adm.in_use, adm.queued, adm.waiting) == (0, 0, 0)


async def test_a_consumer_error_while_prompts_wait_is_raised_as_it_is() -> None:
    """Leaving a run with an error of the consumer's while its prompts wait for slots: that error,
    not a deadline the run never had."""
    engine = ScriptedEngine(token_delay=0.1)
    adm = Admission(slots=1)
    other = adm.admit()
    await other.acquire(1)
    plan = plan_for(engine, b'{"prompt": ["a","b"], "max_tokens": 1000, "ignore_eos": true}')
    with pytest.raises(ValueError, match="the consumer's"):
        async with CompletionRun(engine, plan, Metrics(), ticket=adm.admit()):
            await trio.testing.wait_all_tasks_blocked()
            raise ValueError("the consumer's")
    assert (adm.in_use, adm.queued, adm.waiting) == (1, 0, 0) and engine.in_flight == 0
    other.close()
