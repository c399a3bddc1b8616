"""braid.metrics: the plain histograms and the token timer alone, then every latency histogram and
every abort cause through the real run (CompletionRun on the scripted engine, virtual time)."""

from __future__ import annotations

import math

import pytest
import trio
from prometheus_client import CollectorRegistry, Gauge, Histogram

from braid.engine.base import ChoiceDelta
from braid.engine.scripted import ScriptedEngine
from braid.errors import DeadlineExceeded, EngineError, StreamStalled
from braid.metrics import ABORT_CAUSES, ITL_BUCKETS, EngineFamilies, Metrics, PlainHistogram, TokenTimer
from braid.settings import Settings
from braid.stream.admit import Admission
from braid.stream.run import CompletionRun
from tests.helpers import aborts, arrivals, plan_for

# A token every 0.09 s of virtual time: inside the buckets le=0.1 (ITL, TTFT), away from bounds.
DELAY = 0.09


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    assert value is not None, f"{name} {labels} not exposed"
    return value


def hist(metrics: Metrics, name: str) -> tuple[float, float]:
    """(count, sum) of a histogram."""
    return sample(metrics, f"{name}_count"), sample(metrics, f"{name}_sum")


def bucket(metrics: Metrics, name: str, le: str) -> float:
    return sample(metrics, f"{name}_bucket", le=le)


TTFT = "braid_time_to_first_token_seconds"
ITL = "braid_inter_token_latency_seconds"
E2E = "braid_e2e_request_latency_seconds"


async def drain(run: CompletionRun) -> list:  # type: ignore[type-arg]
    got = []
    while True:
        try:
            got.extend(await run.receive_ready())
        except trio.EndOfChannel:
            return got


# --- the histogram and the timer alone --------------------------------------------------------------


def test_a_plain_histogram_exposes_what_prometheus_clients_own_would() -> None:
    values = [0.0, 0.001, 0.0010001, 0.02, 0.1, 0.1, 3.0, 79.9, 80.0, 1e6]
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    plain = PlainHistogram("h_seconds", "help", ITL_BUCKETS, ours)
    reference = Histogram("h_seconds", "help", buckets=ITL_BUCKETS, registry=theirs)
    for v in values:
        plain.observe(v)
        reference.observe(v)
    plain.observe(0.05, times=3)
    for _ in range(3):
        reference.observe(0.05)

    def samples(r: CollectorRegistry) -> dict[tuple[str, str], float]:
        return {
            (s.name, s.labels.get("le", "")): s.value
            for m in r.collect()
            for s in m.samples
            if not s.name.endswith("_created")
        }

    mine, ref = samples(ours), samples(theirs)
    assert mine.keys() == ref.keys()
    for key, value in ref.items():
        assert mine[key] == pytest.approx(value), key


def test_a_plain_histogram_refuses_a_second_registration() -> None:
    r = CollectorRegistry()
    PlainHistogram("h", "help", (1.0,), r)
    with pytest.raises(ValueError, match="Duplicated"):
        PlainHistogram("h", "help", (1.0,), r)


def delta(index: int, tokens: int) -> ChoiceDelta:
    return ChoiceDelta(index, "x" * tokens, tuple(range(tokens)))


def test_the_timer_counts_tokens_per_choice_and_spreads_a_gap_over_its_tokens() -> None:
    m = Metrics()
    timer = TokenTimer(m, arrived=8.0, choices=2)  # times in binary fractions: exact gaps
    timer.seen([delta(0, 2)], 8.5)  # first output: TTFT 0.5; its two tokens are not ITL
    timer.seen([delta(0, 0)], 8.625)  # no token: nothing
    timer.seen([delta(0, 1), delta(1, 1)], 8.75)  # choice 0: 0.25 s; choice 1's first: no ITL, no TTFT
    timer.seen([delta(0, 4), delta(1, 2)], 9.25)  # choice 0: 4 x 0.125 s; choice 1: 2 x 0.25 s
    assert hist(m, TTFT) == (1, 0.5)
    assert hist(m, ITL) == (1 + 4 + 2, 0.25 + 0.5 + 0.5)
    assert [bucket(m, ITL, le) for le in ("0.1", "0.15", "0.2", "0.3")] == [0, 4, 4, 7]


# --- the latency histograms through the run -----------------------------------------------------------


async def test_a_stream_times_each_engine_request_from_the_requests_arrival(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = ScriptedEngine(token_delay=DELAY)
    plan = plan_for(engine, b'{"prompt": ["a","b","c"], "max_tokens": 5, "ignore_eos": true, "stream": true}')
    m = Metrics()
    arrived = trio.current_time()
    await trio.sleep(1.0)  # the request waited a second before its run
    async with CompletionRun(engine, plan, m, arrived=arrived) as run:
        await drain(run)
    # each of the 3 engine requests: a token at 1.09, 1.18, ... 1.45
    assert hist(m, TTFT) == (3, pytest.approx(3 * (1.0 + DELAY)))
    assert bucket(m, TTFT, "1.0") == 0 and bucket(m, TTFT, "2.5") == 3  # the queue wait is in it
    assert hist(m, ITL) == (3 * 4, pytest.approx(3 * 4 * DELAY))
    assert bucket(m, ITL, "0.075") == 0 and bucket(m, ITL, "0.1") == 12
    assert hist(m, E2E) == (3, pytest.approx(3 * (1.0 + 5 * DELAY)))
    assert bucket(m, E2E, "1.0") == 0 and bucket(m, E2E, "1.5") == 3


async def test_a_run_starts_its_clock_when_entered_unless_told_the_arrival(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = ScriptedEngine(token_delay=DELAY)
    plan = plan_for(engine, b'{"prompt": "a", "max_tokens": 2, "ignore_eos": true, "stream": true}')
    m = Metrics()
    await trio.sleep(5.0)
    async with CompletionRun(engine, plan, m) as run:
        await drain(run)
    assert hist(m, TTFT) == (1, pytest.approx(DELAY))
    assert hist(m, E2E) == (1, pytest.approx(2 * DELAY))


async def test_n_choices_are_one_first_token_and_a_token_each_per_step(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = ScriptedEngine(token_delay=DELAY)
    plan = plan_for(engine, b'{"prompt": ["a","b"], "n": 3, "max_tokens": 4, "ignore_eos": true, "stream": true}')
    m = Metrics()
    async with CompletionRun(engine, plan, m) as run:
        await drain(run)
    assert hist(m, TTFT)[0] == 2  # per engine request, not per choice
    assert hist(m, ITL) == (2 * 3 * 3, pytest.approx(2 * 3 * 3 * DELAY))
    assert hist(m, E2E)[0] == 2


async def test_merged_outputs_count_every_token(autojump_clock: trio.testing.MockClock) -> None:
    """A consumer slower than the engine: its driver lags, and the engine merges the deltas that
    wait (several tokens per output). Every token after the first output still counts once, and
    the sum is the time from the first output to the last."""
    engine = ScriptedEngine(token_delay=0.01)
    plan = plan_for(engine, b'{"prompt": "a", "max_tokens": 40, "ignore_eos": true, "stream": true}')
    m = Metrics()
    outputs = []
    async with CompletionRun(engine, plan, m, Settings(buffer=1)) as run:
        while True:
            try:
                outputs.extend(arrivals(await run.receive_ready()))
            except trio.EndOfChannel:
                break
            await trio.sleep(0.035)
    tokens = [len(o.choices[0].token_ids) for _, o in outputs]
    assert sum(tokens) == 40 and max(tokens) > 1  # merged
    count, total = hist(m, ITL)
    assert count == 40 - tokens[0] > len(outputs) - 1  # per token, not per output
    first_at, end = hist(m, TTFT)[1], hist(m, E2E)[1]
    assert total == pytest.approx(end - first_at)


async def test_a_non_streaming_request_has_no_first_token_only_its_end(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = ScriptedEngine(token_delay=DELAY)
    plan = plan_for(engine, b'{"prompt": ["a","b"], "max_tokens": 5, "ignore_eos": true}')
    m = Metrics()
    async with CompletionRun(engine, plan, m) as run:
        await drain(run)
    assert hist(m, TTFT) == (0, 0) and hist(m, ITL) == (0, 0)
    assert hist(m, E2E) == (2, pytest.approx(2 * 5 * DELAY))


async def test_an_aborted_request_keeps_its_first_token_but_has_no_end(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = ScriptedEngine(token_delay=DELAY)
    plan = plan_for(engine, b'{"prompt": ["a","b"], "max_tokens": 1000, "ignore_eos": true, "stream": true}')
    m = Metrics()
    with trio.move_on_after(10 * DELAY + DELAY / 2):
        async with CompletionRun(engine, plan, m) as run:
            await drain(run)
    assert hist(m, TTFT)[0] == 2
    assert hist(m, ITL)[0] == 2 * 9
    assert hist(m, E2E) == (0, 0)


# --- aborts by cause, through the run ---------------------------------------------------------------


LONG = b', "max_tokens": 1000, "ignore_eos": true, "stream": true}'


async def test_every_cause_is_exposed_from_the_start() -> None:
    m = Metrics()
    for cause in ABORT_CAUSES:
        assert sample(m, "braid_engine_aborts_total", cause=cause) == 0


@pytest.mark.parametrize(("draining", "cause"), [(False, "disconnect"), (True, "drain")])
async def test_a_run_cancelled_from_outside_counts_disconnect_or_drain(
    draining: bool, cause: str, autojump_clock: trio.testing.MockClock
) -> None:
    engine = ScriptedEngine(token_delay=DELAY)
    plan = plan_for(engine, b'{"prompt": ["a","b","c"]' + LONG)
    m = Metrics()
    with trio.move_on_after(1.0):
        async with CompletionRun(engine, plan, m, draining=lambda: draining) as run:
            await drain(run)
    assert engine.aborted_total == 3
    assert aborts(m.registry) == {cause: 3}


async def test_a_stalled_client_counts_stall(autojump_clock: trio.testing.MockClock) -> None:
    engine = ScriptedEngine(token_delay=0.0)
    plan = plan_for(engine, b'{"prompt": ["a","b"]' + LONG)
    m = Metrics()
    run = CompletionRun(engine, plan, m, Settings(buffer=4, stall_timeout=2.0))
    async with run:
        await trio.sleep(3.0)  # reads nothing
        with pytest.raises(StreamStalled):
            await run.receive_ready()
    assert aborts(m.registry) == {"stall": 2}


async def test_the_deadline_counts_timeout_and_a_prompt_still_queued_counts_queue(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = ScriptedEngine(token_delay=DELAY)
    adm = Admission(slots=2)
    plan = plan_for(engine, b'{"prompt": ["a","b","c"]' + LONG)
    m = Metrics()
    run = CompletionRun(
        engine, plan, m, Settings(request_timeout=2.0), ticket=adm.admit(), deadline=trio.current_time() + 2.0
    )
    async with run:
        with pytest.raises(DeadlineExceeded):
            await drain(run)
    assert aborts(m.registry) == {"timeout": 2, "queue": 1}  # "c" never got a slot


async def test_a_failed_sibling_counts_error_and_the_failed_request_an_engine_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = ScriptedEngine(token_delay=DELAY)
    plan = plan_for(engine, b'{"prompt": ["a","b braid:fail@3","c","d"]' + LONG)
    m = Metrics()
    with pytest.raises(EngineError):
        async with CompletionRun(engine, plan, m) as run:
            await drain(run)
    assert aborts(m.registry) == {"error": 3}
    assert sample(m, "braid_engine_errors_total") == 1


async def test_a_consumer_error_counts_error(autojump_clock: trio.testing.MockClock) -> None:
    engine = ScriptedEngine(token_delay=DELAY)
    plan = plan_for(engine, b'{"prompt": ["a","b"]' + LONG)
    m = Metrics()
    with pytest.raises(ValueError, match="a bug"):
        async with CompletionRun(engine, plan, m) as run:
            await run.receive_ready()
            raise ValueError("a bug")
    assert aborts(m.registry) == {"error": 2}


async def test_prompts_waiting_for_slots_when_the_client_leaves_count_queue(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = ScriptedEngine(token_delay=DELAY)
    adm = Admission(slots=1)
    plan = plan_for(engine, b'{"prompt": ["a","b","c","d"]' + LONG)
    m = Metrics()
    with trio.move_on_after(1.0):
        async with CompletionRun(engine, plan, m, ticket=adm.admit()) as run:
            await drain(run)
    assert aborts(m.registry) == {"disconnect": 1, "queue": 3}
    assert sample(m, "braid_engine_requests_total") == 1


async def test_a_run_never_entered_counts_its_prompts_as_queue_once() -> None:
    engine = ScriptedEngine(token_delay=0.0)
    adm = Admission(slots=1)
    plan = plan_for(engine, b'{"prompt": ["a","b"], "max_tokens": 2, "stream": true}')
    m = Metrics()
    run = CompletionRun(engine, plan, m, ticket=adm.admit())
    run.discard()
    run.discard()
    assert aborts(m.registry) == {"queue": 2} and adm.queued == 0


async def test_discarding_a_run_that_ran_counts_nothing_more() -> None:
    engine = ScriptedEngine(token_delay=0.0)
    plan = plan_for(engine, b'{"prompt": ["a","b"], "max_tokens": 2, "stream": true}')
    m = Metrics()
    async with CompletionRun(engine, plan, m) as run:
        await drain(run)
    run.discard()
    assert aborts(m.registry) == {} and hist(m, E2E)[0] == 2


async def test_every_prompt_is_counted_once_finished_failed_or_aborted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The invariant braid.metrics states, over runs that end every way, sharing two slots."""
    engine = ScriptedEngine(token_delay=DELAY)
    adm = Admission(slots=2)
    m = Metrics()
    prompts = 0

    async def one(body: bytes, request_timeout: float | None = None) -> None:
        nonlocal prompts
        plan = plan_for(engine, body)
        prompts += len(plan.items)
        deadline = trio.current_time() + request_timeout if request_timeout is not None else math.inf
        settings = Settings(request_timeout=request_timeout)
        run = CompletionRun(engine, plan, m, settings, ticket=adm.admit(), deadline=deadline)
        try:
            async with run:
                await drain(run)
        except (EngineError, DeadlineExceeded):
            pass

    ten = b', "max_tokens": 10, "ignore_eos": true, "stream": true}'
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, b'{"prompt": ["a","b","c"]' + ten)
            nursery.start_soon(one, b'{"prompt": ["d","e braid:fail@2","f","g"]' + ten)
            nursery.start_soon(one, b'{"prompt": ["h","i","j","k"]' + ten, 0.5)
            nursery.start_soon(one, b'{"prompt": ["l","m"], "max_tokens": 4, "ignore_eos": true}')
            with trio.move_on_after(0.7):  # this client leaves
                await one(b'{"prompt": ["n","o","p"]' + ten)
    assert engine.in_flight == 0 and (adm.in_use, adm.queued) == (0, 0)
    assert prompts == 3 + 4 + 4 + 2 + 3
    outcomes = hist(m, E2E)[0] + sample(m, "braid_engine_errors_total") + sum(aborts(m.registry).values())
    assert outcomes == prompts
    assert outcomes == sample(m, "braid_engine_requests_total") + aborts(m.registry).get("queue", 0)


# --- the engine's own families (vLLM's vllm:*) ------------------------------------------------------


async def test_vllms_waiting_gauges_count_the_requests_waiting_in_braids_admission() -> None:
    """The engine's families are forwarded as they are, except the waiting gauges: braid's
    requests waiting for engine slots (admission's ring, read at scrape time) are added, under
    the ``capacity`` reason in the gauge by reason (so the reasons still sum to the total)."""
    source = CollectorRegistry()  # stands for the registry vLLM's stat logger writes
    labels = ["model_name", "engine"]
    Gauge("vllm:num_requests_waiting", "w", labels, registry=source).labels("m", "0").set(2)
    by_reason = Gauge("vllm:num_requests_waiting_by_reason", "w", [*labels, "reason"], registry=source)
    by_reason.labels("m", "0", "capacity").set(1)
    by_reason.labels("m", "0", "deferred").set(1)
    Gauge("vllm:num_requests_running", "r", labels, registry=source).labels("m", "0").set(7)
    Gauge("process_other", "not the engine's", registry=source).set(1)
    adm = Admission(slots=1)
    m = Metrics()
    families = EngineFamilies(source, "vllm:", "vllm:num_requests_waiting", "vllm:num_requests_waiting_by_reason")
    m.track_engine(families, lambda: adm.waiting)

    def exposed() -> tuple[float, float, float, float]:
        got = m.registry.get_sample_value
        e = {"model_name": "m", "engine": "0"}
        return (
            got("vllm:num_requests_waiting", e) or 0.0,
            got("vllm:num_requests_waiting_by_reason", {**e, "reason": "capacity"}) or 0.0,
            got("vllm:num_requests_waiting_by_reason", {**e, "reason": "deferred"}) or 0.0,
            got("vllm:num_requests_running", e) or 0.0,
        )

    assert exposed() == (2, 1, 1, 7)
    assert m.registry.get_sample_value("process_other") is None
    first = adm.admit()
    await first.acquire(1)  # the one slot
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(adm.admit().acquire, 1)
        await trio.testing.wait_all_tasks_blocked()
        assert exposed() == (2 + 3, 1 + 3, 1, 7)
        first.release(1)  # the slot goes to the first in the ring
        await trio.testing.wait_all_tasks_blocked()
        assert exposed() == (2 + 2, 1 + 2, 1, 7)
        nursery.cancel_scope.cancel()
    assert exposed() == (2, 1, 1, 7)
    assert b"vllm:num_requests_waiting{" in m.render()
