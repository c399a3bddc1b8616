"""Stateful: several concurrent requests on one engine, with events interleaved by Hypothesis.

The trio loop runs in a helper thread on a *manual* MockClock (Hypothesis drives the rules);
rules call into it with ``trio.from_thread.run``. Virtual time moves only in the ``advance`` rule,
which turns autojump on just for the span it advances, so every timer inside the span fires in
order (heartbeats, stall timeouts and token delays keep their meaning) and nothing moves between
rules. After each step every request's trace so far must satisfy the prefix-safe invariants; at
teardown everything is run to its end and the complete traces must satisfy all of them.

:class:`ConcurrentChatRequests` is the same machine with chat requests (single and batch routes)
opened beside the completions ones, on the same engine and admission (with a reserve of one).

Hypothesis seeds a derandomized state machine from its class's source: an edit to
:class:`ConcurrentRequests` changes which runs the ``ci`` profile tries.
"""

from __future__ import annotations

import itertools
import math
import threading

import trio
import trio.testing
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from braid.engine.scripted import ScriptedEngine
from model import PREFIX_SAFE, check_server, check_trace
from property_tests.harness import Recorder, RecordingAdmission, RecordingEngine, Stop, run_request
from property_tests.strategies import scenarios

SLOTS = 4
"""The server's engine slots: fewer than the prompts the requests bring, so they queue (n <= 4 fits)."""
RESERVE = 1
BACKGROUND_SLOTS = 2
"""The background class's cap: below SLOTS - RESERVE, so the cap binds."""


class ConcurrentRequests(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = trio.testing.MockClock()  # autojump off: time moves only in advance()
        self.engine = RecordingEngine(ScriptedEngine(token_delay=0.5))
        self.admission = RecordingAdmission(slots=SLOTS, reserve=RESERVE, background_slots=BACKGROUND_SLOTS)
        self.seq = itertools.count()
        self.requests: list[tuple[Recorder, Stop]] = []
        self.ended: set[int] = set()
        started = threading.Event()
        self.token: trio.lowlevel.TrioToken | None = None

        async def host() -> None:
            self.token = trio.lowlevel.current_trio_token()
            self.stop_host = trio.Event()
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                started.set()
                await self.stop_host.wait()
                nursery.cancel_scope.cancel()

        self.thread = threading.Thread(target=trio.run, args=(host,), kwargs={"clock": self.clock}, daemon=True)
        self.thread.start()
        started.wait()

    def _call(self, afn, *args):  # type: ignore[no-untyped-def]
        return trio.from_thread.run(afn, *args, trio_token=self.token)

    async def _advance(self, dt: float) -> None:
        self.clock.autojump_threshold = 0
        try:
            await trio.sleep(dt)
        finally:
            self.clock.autojump_threshold = math.inf
        await trio.testing.wait_all_tasks_blocked()

    async def _open(self, rec: Recorder, rid: str, stop: Stop) -> None:
        t0 = trio.current_time()

        async def one() -> None:
            await run_request(self.engine, rec, rid, t0=t0, stop=stop, admission=self.admission)

        self.nursery.start_soon(one)
        await trio.testing.wait_all_tasks_blocked()

    @initialize(s=scenarios(max_prompts=8))
    def first_request(self, s) -> None:  # type: ignore[no-untyped-def]
        self.open_request(s)

    @rule(s=scenarios(max_prompts=8))
    def open_request(self, s) -> None:  # type: ignore[no-untyped-def]
        rid = f"cmpl-s{len(self.requests)}"
        rec = Recorder(s, self.seq)
        stop = Stop()
        self.engine.requests[rid] = (rec, s.step_delays)
        self.requests.append((rec, stop))
        self._call(self._open, rec, rid, stop)

    @rule(dt=st.sampled_from([0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 30.0]))
    def advance(self, dt: float) -> None:
        self._call(self._advance, dt)

    @precondition(lambda self: len(self.requests) > 0)
    @rule(i=st.integers(0, 63), kind=st.sampled_from(["disconnect", "drain"]))
    def stop_one(self, i: int, kind: str) -> None:
        rec, stop = self.requests[i % len(self.requests)]

        async def go() -> None:
            stop.set(kind)
            await trio.testing.wait_all_tasks_blocked()

        self._call(go)

    @rule()
    def drain_server(self) -> None:
        """Drain with no grace left: every request still running is cancelled now."""

        async def go() -> None:
            for _, stop in self.requests:
                stop.set("drain")
            await trio.testing.wait_all_tasks_blocked()

        self._call(go)

    @invariant()
    def prefixes_follow_the_model(self) -> None:
        def check() -> None:  # runs inside the trio thread: traces are not mutated meanwhile
            for rec, _ in self.requests:
                trace = rec.trace()
                bad = [v for v in check_trace(trace) if v.name in PREFIX_SAFE]
                assert not bad, "\n".join(map(str, bad))
            server = check_server([rec.trace() for rec, _ in self.requests], SLOTS, RESERVE, BACKGROUND_SLOTS)
            assert not server, "\n".join(map(str, server))
            assert self.engine.inner.in_flight <= SLOTS
            aborted = self.engine.inner.aborted_ids
            assert len(aborted) == len(set(aborted)), f"aborted twice: {aborted}"
            assert self.engine.inner.in_flight == sum(len(rec.open_engine) for rec, _ in self.requests)

        async def in_trio() -> None:
            check()

        self._call(in_trio)

    def teardown(self) -> None:
        try:

            async def finish_all() -> None:
                for _ in range(20):
                    if all(any(r["kind"] == "end" for r in rec.records) for rec, _ in self.requests):
                        break
                    await self._advance(10_000.0)

            self._call(finish_all)

            async def final() -> None:
                for rec, _ in self.requests:
                    bad = check_trace(rec.trace())
                    assert not bad, "\n".join(map(str, bad))
                assert self.engine.inner.in_flight == 0
                adm = self.admission
                assert (adm.in_use, adm.queued, adm.queued_background, adm.background_in_use, adm.waiting) == (0,) * 5

            self._call(final)
        finally:

            async def stop() -> None:
                self.stop_host.set()

            self._call(stop)
            self.thread.join()


class ConcurrentChatRequests(ConcurrentRequests):
    """Chat requests beside completions ones: one engine, one admission (four slots, a reserve of one)."""

    def __init__(self) -> None:
        super().__init__()
        # before any request opens
        self.admission = RecordingAdmission(slots=SLOTS, reserve=RESERVE, background_slots=BACKGROUND_SLOTS)

    @rule(s=scenarios(max_prompts=8, chat=True))
    def open_chat_request(self, s) -> None:  # type: ignore[no-untyped-def]
        rid = f"chatcmpl-s{len(self.requests)}"
        rec = Recorder(s, self.seq)
        stop = Stop()
        self.engine.requests[rid] = (rec, s.step_delays)
        self.requests.append((rec, stop))
        self._call(self._open, rec, rid, stop)


ConcurrentRequests.TestCase.settings = settings(settings.default, stateful_step_count=15)  # the profile (conftest)
TestConcurrentRequests = ConcurrentRequests.TestCase
ConcurrentChatRequests.TestCase.settings = settings(settings.default, stateful_step_count=15)
TestConcurrentChatRequests = ConcurrentChatRequests.TestCase
