"""The streaming response body: a quart ``ResponseBody`` that owns the request's nursery.

Quart sends a body as ``async with body: async for data in body: send(data)`` in one task, so the
run's nursery lives between ``__aenter__`` and ``__aexit__`` and ``__anext__`` is a plain coroutine:
no nursery or cancel scope is held across a ``yield`` (trio forbids that in async generators).

Each ``__anext__`` returns every event that is ready as one body chunk: one event when the stream
is idle, many under load, because each body send costs far more than encoding an event. When
drivers handed its events over (not the engine itself, see :mod:`braid.stream.run`), it gathers for a
few scheduler rounds more while they keep adding (a producer faster than the sends; see
:func:`_gather`), never waiting on a clock. When nothing
arrives for the heartbeat's period it returns an SSE comment, which keeps proxies from timing
out an idle stream (the rules are :mod:`braid.stream.heartbeat`'s). When the client disconnects, quart cancels this task; ``__aexit__``
then aborts every engine request of the run before it returns.
"""

from __future__ import annotations

from types import TracebackType

import trio
from quart.wrappers.response import ResponseBody

from braid.errors import BraidError
from braid.stream.heartbeat import TICK
from braid.stream.merge import Phase, StreamMerger
from braid.stream.plan import Arrival
from braid.stream.run import CompletionRun
from braid.wire.output import HEARTBEAT

GATHER_ROUNDS = 4
"""At most this many scheduler rounds gather a chunk's events (see :func:`_gather`)."""


class CompletionStream(ResponseBody):
    def __init__(self, run: CompletionRun, merger: StreamMerger) -> None:
        assert run.heartbeat is not None, "a stream's run has a heartbeat (a streaming plan)"
        self._run = run
        self._merger = merger
        self._heartbeat = run.heartbeat

    async def __aenter__(self) -> CompletionStream:
        await self._run.__aenter__()
        return self

    async def __aexit__(  # type: ignore[override]
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        return await self._run.__aexit__(exc_type, exc, tb)

    @property
    def response_id(self) -> str:
        """The id every chunk of this stream carries."""
        return self._merger.plan.meta.id

    def __aiter__(self) -> CompletionStream:
        return self

    async def __anext__(self) -> bytes:
        merger = self._merger
        run = self._run
        heartbeat = self._heartbeat
        heartbeat.new_chunk()
        while merger.phase is Phase.STREAMING:
            waited = False
            try:
                ready = run.take_ready()
                arrivals: list[Arrival] | None
                if TICK in ready:
                    arrivals = [a for a in ready if a is not TICK]  # type: ignore[misc]
                else:
                    arrivals = ready  # type: ignore[assignment]
                if not arrivals:
                    # Waits for output, or for the heartbeat's period (braid.stream.heartbeat).
                    arrivals = await heartbeat.wait(run.receive_ready)
                    if arrivals is None:
                        return HEARTBEAT
                    waited = True
            except trio.EndOfChannel:
                return merger.finish()
            except BraidError as err:
                return merger.fail(err)
            if run.relayed or not waited:
                # Drivers hand over in the same rounds as this task runs: gather what they add.
                # Outputs the engine delivered came all at once, before this task woke, so
                # there is nothing to gather, and the wait was this chunk's checkpoint.
                run.relayed = False
                await _gather(run, arrivals)
            data = merger.feed(arrivals)
            if merger.all_finished:
                # The last choice just finished: the engine has nothing more to say (its last
                # output is the one that finishes), so the usage and [DONE] go in this chunk
                # rather than in one send more once the drivers have ended.
                return data + merger.finish()
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
