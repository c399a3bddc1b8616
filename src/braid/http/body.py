"""The streaming response body: a quart ``ResponseBody`` that owns the request's nursery.

Quart sends a body as ``async with body: async for data in body: send(data)`` in one task, so the
run's nursery lives between ``__aenter__`` and ``__aexit__`` and ``__anext__`` is a plain coroutine:
no nursery or cancel scope is held across a ``yield`` (trio forbids that in async generators).

Each ``__anext__`` returns every event that is ready as one body chunk: one event when the stream
is idle, many under load, because each body send costs far more than encoding an event. Once it
has an event it gathers for a few scheduler rounds more while the producers keep adding (a
producer faster than the sends; see :func:`_gather`), never waiting on a clock. When
nothing arrives for ``heartbeat`` seconds it returns an SSE comment, which keeps proxies from
timing out an idle stream. When the client disconnects, quart cancels this task; ``__aexit__``
then aborts every engine request of the run before it returns.
"""

from __future__ import annotations

from types import TracebackType

import trio
from quart.wrappers.response import ResponseBody

from braid.encode import HEARTBEAT
from braid.errors import BraidError
from braid.merge import Arrival, Phase, StreamMerger
from braid.run import TICK, CompletionRun

GATHER_ROUNDS = 4
"""At most this many scheduler rounds gather a chunk's events (see :func:`_gather`)."""


class CompletionStream(ResponseBody):
    def __init__(self, run: CompletionRun, merger: StreamMerger, *, heartbeat: float) -> None:
        run.heartbeat = heartbeat  # the run's clock (started by its __aenter__) ends idle waits
        self._run = run
        self._merger = merger
        self._heartbeat = heartbeat

    async def __aenter__(self) -> CompletionStream:
        await self._run.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        return await self._run.__aexit__(exc_type, exc, tb)

    def __aiter__(self) -> CompletionStream:
        return self

    async def __anext__(self) -> bytes:
        merger = self._merger
        run = self._run
        idle_from: float | None = None  # when this call first waited: outputs that encode to
        # nothing (merger.feed -> b"") must not restart the heartbeat period
        while merger.phase is Phase.STREAMING:
            try:
                arrivals = run.take_ready()
                if not arrivals:
                    # No timeout here: the run's heartbeat clock ends this wait with a TICK once
                    # it has lasted a period (a cancel scope per chunk cost ~9 % of the thread).
                    resumed = idle_from is not None
                    if idle_from is None:
                        idle_from = trio.current_time()
                    run.waiting_since = since = idle_from
                    try:
                        if not resumed:
                            arrivals = await run.receive_ready()
                        else:
                            # The idle period goes on after outputs that encoded to nothing (or a
                            # stale tick). The clock may have ticked for it already (that tick
                            # came with those outputs) or slept through its deadline while no
                            # wait was open, so this rare wait keeps its own deadline.
                            with trio.move_on_at(idle_from + self._heartbeat) as deadline:
                                arrivals = await run.receive_ready()
                            if deadline.cancelled_caught:
                                return HEARTBEAT
                    finally:
                        run.waiting_since = None
                else:
                    since = None
                if TICK in arrivals:
                    arrivals = [a for a in arrivals if a is not TICK]
                    if not arrivals:
                        # the clock's own arithmetic: now - since could round below the period
                        if since is not None and trio.current_time() >= since + self._heartbeat:
                            return HEARTBEAT
                        continue  # a tick for a wait that had already ended
            except trio.EndOfChannel:
                return merger.finish()
            except BraidError as err:
                return merger.fail(err)
            await _gather(run, arrivals)
            data = merger.feed(arrivals)
            if data:
                return data
        raise StopAsyncIteration


async def _gather(run: CompletionRun, arrivals: list[Arrival]) -> None:
    """Add to ``arrivals`` what the producers add while they keep adding, for a few rounds.

    Each round is one checkpoint: every task that is runnable now runs once, so a driver whose
    output is already in hand hands it over. The gathering stops at the first round that brings
    nothing (under a real engine, almost always the first: outputs come once per engine step) or
    after :data:`GATHER_ROUNDS`, so it never waits on a clock. One body send costs far more than
    a round, so a producer that is faster than the sends gets its events sent together. (trio
    runs a round's tasks in a random order, so a round that runs the consumer before a producer
    ends the gathering early; waiting for a second empty round would cost every chunk of a real
    engine's streams a task switch more.)

    Always checkpoints at least once (the fast send path does not). The end of the channel and
    the run's error are left for the next :meth:`CompletionRun.take_ready`, which raises them
    after what was gathered has been sent, as when they come between two chunks.
    """
    for _ in range(GATHER_ROUNDS):
        await trio.lowlevel.checkpoint()
        try:
            more = run.take_ready()
        except (trio.EndOfChannel, BraidError):
            return
        if not more:
            return
        arrivals.extend(a for a in more if a is not TICK)  # no wait is open: a tick is stale
