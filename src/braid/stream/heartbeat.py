"""The heartbeat: a stream whose body has waited a whole period for output sends an SSE comment.

Proxies and clients time out a connection that stays silent, and a stream may wait long for its
next token (a long prefill, a full engine). So the stream's body, the consumer of the run's
channel, says "still here" once it has waited a whole ``period`` since its last write.

One :class:`Heartbeat` per stream, and every rule of it is here:

* **Owner.** The run (:class:`~braid.stream.run.CompletionRun`) makes it, starts its :meth:`clock` task
  in the run's nursery with a clone of the run's channel, and :meth:`stop`\\ s it when the drivers
  are done (its clone then closes with theirs, so the channel ends). The body only calls
  :meth:`new_chunk` and :meth:`wait`.
* **Idle period.** It starts when the consumer first waits after a write, and goes on across
  outputs that encode to nothing (an empty delta, a held-back stop string), which write nothing.
* **No timer per wait.** A cancel scope and a deadline for every chunk of every stream would
  cost more than the rest of the wait. Instead the clock sleeps a whole period at a time; when
  it finds the consumer waiting for a period, it puts :data:`TICK` into the channel, which ends
  the wait like an output would. A consumer that is never idle that long never hears from it.
* **Stale ticks.** A tick can arrive after the wait it was for has ended (the outputs came in
  the same round): :meth:`wait` checks the time, and the gathering of a chunk drops ticks.
* **A resumed period keeps its own deadline.** When a period goes on after outputs that wrote
  nothing, the clock may have ticked for it already (that tick came with those outputs) or slept
  through its deadline while no wait was open; that rare wait sets its own ``move_on_at``.

Cancellation: :meth:`wait` is cancelled like the receive it wraps; the clock runs until
:meth:`stop` or until its nursery is cancelled, and sends nothing after either.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

import attrs
import trio


class Tick(enum.Enum):
    """The type of :data:`TICK` (a typed sentinel, as h11's ``NEED_DATA``)."""

    TICK = "heartbeat tick"


TICK: Final = Tick.TICK
"""What the clock puts into the run's channel to end a wait that has lasted a period."""

T = TypeVar("T")


# The period is checked when the heartbeat is made; no per-assignment hook: the waits set the
# idle fields once or twice per body chunk, and attrs' validating __setattr__ cost more than they.
@attrs.define(eq=False, on_setattr=attrs.setters.NO_OP)
class Heartbeat:
    period: float = attrs.field(validator=attrs.validators.gt(0))
    _idle_from: float | None = None  # start of the consumer's idle period (None: it just wrote)
    _waiting_since: float | None = None  # read by the clock: the idle period of the open wait
    _scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    _ticks: trio.MemorySendChannel[Any] | None = None

    async def clock(self, ticks: trio.MemorySendChannel[Any]) -> None:
        """Put :data:`TICK` into ``ticks`` each time the consumer has waited a period (a task).

        Asleep for at least ``period`` at a time: a consumer that starts waiting while the clock
        sleeps has its deadline (its idle period's start + ``period``) after the clock wakes,
        and the clock then sleeps exactly until it. Closes ``ticks`` when it stops.
        """
        self._ticks = ticks
        ticked_for: float | None = None
        period = self.period
        with ticks, self._scope:
            while True:
                since = self._waiting_since
                if since is None or since == ticked_for:
                    await trio.sleep(period)
                    continue
                if trio.current_time() < since + period:
                    await trio.sleep_until(since + period)
                    continue
                ticked_for = since
                try:
                    ticks.send_nowait(TICK)
                except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                    pass  # a full channel has something for the consumer already

    def stop(self) -> None:
        """Stop the clock now and close its clone of the channel (the drivers are done)."""
        self._scope.cancel()
        if self._ticks is not None:
            self._ticks.close()

    def new_chunk(self) -> None:
        """The consumer starts a new body chunk: its next wait starts a new idle period."""
        self._idle_from = None

    async def wait(self, receive: Callable[[], Awaitable[list[T | Tick]]]) -> list[T] | None:
        """``receive()``'s next items without ticks (never empty), or ``None`` once the consumer
        has waited a whole period since its idle period began: time to send a comment.

        Exceptions from ``receive`` (the end of the channel, the run's error) pass through.
        """
        now = trio.current_time()
        resumed = self._idle_from is not None
        since = self._idle_from if self._idle_from is not None else now
        self._idle_from = since
        deadline = since + self.period
        while True:
            self._waiting_since = since
            try:
                if not resumed:
                    batch = await receive()
                else:
                    with trio.move_on_at(deadline) as scope:
                        batch = await receive()
                    if scope.cancelled_caught:
                        return None
            finally:
                self._waiting_since = None
            items = [a for a in batch if a is not TICK]
            if items:
                return items  # type: ignore[return-value]
            # Only ticks: the clock's own arithmetic (now - since could round below the period).
            if trio.current_time() >= deadline:
                return None
            resumed = True  # a tick for a wait that had already ended


__all__ = ["TICK", "Heartbeat", "Tick"]
