"""Run: one nursery per request, one driver task per prompt, all feeding one bounded channel.

:class:`CompletionRun` is an async context manager that owns every task and channel of a request:

* ``__aenter__`` opens the *outer* nursery and starts a supervisor in it, which enters the
  drivers' cancel scope and opens the *inner* nursery there with one driver per prompt (a
  one-prompt request's driver runs in the supervisor's own task, in the same scope: a task and
  a nursery fewer for most requests). Drivers send ``(prompt_idx, EngineOutput)`` into clones of
  one bounded memory channel; the consumer reads it with :meth:`receive_ready`.
* Drivers start :data:`START_CHUNK` at a time, one chunk per scheduler round: each driver's
  first step (the engine's input processing and the add) is synchronous, and 1024 of them in
  one round held every other stream of the server up (docs/performance-log.md, round 4). A driver
  whose chunk starts after the run was cancelled opens no engine request.
* A driver owns its engine request (open, abort, failure, the slot it holds) but is not woken
  for each output: it passes the engine a ``deliver`` function, and an engine that supports it
  (vLLM's) puts each output into the channel itself where it makes it, as long as the channel has
  room and the run is not ending (:mod:`braid.engine.base`). Otherwise the driver takes the
  output from the iterator and sends it, waiting for room. Either way the channel holds the
  prompt's outputs in order, and the driver ends after the last.
* When an engine request fails, the run records the error and cancels the drivers' scope at once,
  so every sibling is aborted immediately, not when the consumer gets round to the error. The
  engine reports the failure through the ``on_failure`` handler its driver passes to
  ``Engine.open_request`` as soon as it knows it, so this holds while the driver itself is
  blocked on a full channel (a client that reads nothing), at no cost per output. Only the drivers'
  scope is cancelled: the consumer, which runs in the body of the outer nursery, can still write
  the error event.
* A driver that cannot hand an output to the consumer for ``stall_timeout`` seconds (the client
  stopped reading) fails the run with :class:`~braid.errors.StreamStalled`, which aborts all.
* ``__aexit__`` with an exception (client disconnect, server drain, any cancellation) cancels
  every driver; each engine adapter shields and bounds its own abort, so when ``__aexit__``
  returns no engine request of this run is left running.
* Before the drivers are cancelled (by an error or by ``__aexit__``), the engine is told to abort
  every request of the run that is still open in one call (``Engine.abort_requests``): for a
  batch of 64 that is one abort message to vLLM's engine core, not 64 trickling in while the
  drivers unwind one by one.

* With admission (:mod:`braid.stream.admit`), the supervisor asks the request's ticket for each
  prompt's slots in prompt order and starts the prompt's driver only once they are granted; the
  driver hands them back when its engine request has ended, or a step or two before: when the
  engine says at most ``handover_tokens`` of its ``max_tokens`` are left, so that the next
  prompt's request waits in the engine's queue as the slot frees (``docs/admission.md``). A prompt still waiting for its slots
  when the run is cancelled never reaches the engine, and :meth:`CompletionRun.__aexit__` closes
  the ticket, so a run leaves nothing queued and holds no slot once it is over.
* With a ``deadline`` (``--request-timeout``, on Trio's clock) the drivers and the slot wait are
  cancelled when it passes, and the run fails with :class:`~braid.errors.DeadlineExceeded`.

* Metrics (:mod:`braid.metrics`): each driver times its engine request from ``arrived`` (the
  HTTP request's arrival) with a :class:`~braid.metrics.TokenTimer` and counts its end: finished
  (``braid_e2e_request_latency_seconds``), failed in the engine (``braid_engine_errors_total``)
  or aborted (``braid_engine_aborts_total{cause}``, the cause read when the driver ends, see
  :meth:`CompletionRun._abort_cause`). Prompts that never reached the engine are counted as
  aborted for ``queue`` when the run ends (or is discarded unentered, :meth:`discard`).

* A streaming run owns its stream's :class:`~braid.stream.heartbeat.Heartbeat`: it starts the heartbeat's
  clock in the outer nursery with a clone of the channel, and stops it when the drivers are done.
* Leaving ``async with`` raises the run's own exception, not the nursery's group around it: the
  error the consumer raised (:meth:`receive_ready` raises the run's error), or the cancellation.

The drivers get a scope of their own because cancelling a nursery's scope also cancels the body of its
``async with``, which here is the consumer still writing the response.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager

import attrs
import trio

from braid.engine.base import Ending, Engine, EngineOutput, Observe
from braid.errors import BraidError, DeadlineExceeded, DrainTimeout, StreamStalled
from braid.metrics import AbortCause, Metrics, TokenTimer
from braid.settings import Settings
from braid.stream.admit import Ticket
from braid.stream.heartbeat import Heartbeat, Tick
from braid.stream.plan import Arrival, Plan, PlanItem

START_CHUNK = 64
"""Drivers started per scheduler round (see ``_supervise``)."""

MAX_BATCH = 1024
"""The most arrivals one :meth:`CompletionRun.receive_ready` returns."""


@attrs.define(eq=False)
class CompletionRun:
    engine: Engine
    plan: Plan
    metrics: Metrics
    settings: Settings = attrs.Factory(Settings)
    ticket: Ticket | None = None
    """The request's admission ticket (None: no admission control); the run closes it on exit."""
    deadline: float = math.inf
    """When the run fails with DeadlineExceeded (Trio's clock)."""
    live: set[CompletionRun] | None = None
    """The server's set of open runs: the run is in it between ``__aenter__`` and ``__aexit__``,
    so a drain that runs out of time can end each one with :meth:`abort_all`."""
    arrived: float | None = None
    """When the HTTP request arrived (Trio's clock), where the latency histograms start; None:
    when the run is entered."""
    observe: Callable[[int], Observe | None] | None = None
    """The engine's ``observe`` hook for each prompt's request, by prompt index (None: none)."""
    draining: Callable[[], bool] = lambda: False
    """Whether the server is draining: asked when the run is cancelled from outside, to count its
    aborts as ``drain`` rather than ``disconnect`` (the HTTP layer's state, passed in)."""
    heartbeat: Heartbeat | None = attrs.field(init=False)
    """The stream's heartbeat (a streaming plan's run only)."""
    error: BraidError | None = None
    relayed: bool = False
    """Whether a driver has handed an output over since the consumer last cleared this (the
    consumer gathers for a few rounds then: :func:`braid.routes.body._gather`); outputs the engine
    delivered itself do not set it."""
    _outer_cm: AbstractAsyncContextManager[trio.Nursery] | None = None
    _outer: trio.Nursery | None = None
    _drivers: trio.CancelScope = attrs.Factory(trio.CancelScope)  # around the drivers (see _supervise)
    _recv: trio.MemoryReceiveChannel[Arrival | Tick] | None = None
    _open_ids: set[str] = attrs.Factory(set)  # engine requests opened and not yet finished
    _cancelled: bool = False
    _entered: bool = False
    _reached: int = 0  # prompts whose engine request was opened (or refused by the engine)
    _exit_error: bool = False  # left with an exception that is not a cancellation

    def __attrs_post_init__(self) -> None:
        self.heartbeat = Heartbeat(self.settings.heartbeat) if self.plan.stream else None

    async def __aenter__(self) -> CompletionRun:
        self._entered = True
        if self.arrived is None:
            self.arrived = trio.current_time()
        send, self._recv = trio.open_memory_channel[Arrival | Tick](self.settings.buffer)
        self._outer_cm = trio.open_nursery()
        self._outer = await self._outer_cm.__aenter__()
        try:
            if self.heartbeat is not None:
                self._outer.start_soon(self.heartbeat.clock, send.clone())
            self._outer.start_soon(self._supervise, send)
        except BaseException as exc:
            await self._outer_cm.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        if self.live is not None:
            self.live.add(self)
        return self

    async def __aexit__(self, exc_type, exc, tb) -> bool | None:  # type: ignore[no-untyped-def]
        assert self._outer_cm is not None and self._recv is not None
        if exc is not None and not isinstance(exc, trio.Cancelled):
            self._exit_error = True  # before the drivers are cancelled: it is their abort's cause
        if exc is not None or self.error is not None:
            self._cancel_drivers()
        try:
            return await self._outer_cm.__aexit__(exc_type, exc, tb)
        except BaseExceptionGroup as group:
            raise _the_exception(group) from None
        finally:
            self._recv.close()
            if self.ticket is not None:
                self.ticket.close()
            if self.live is not None:
                self.live.discard(self)
            self._count_dropped()

    def discard(self) -> None:
        """Give up a run that was never entered (a stream quart never sent): close its ticket and
        count its prompts as dropped from the queue. Does nothing more for a run that was entered."""
        if self.ticket is not None:
            self.ticket.close()
        if not self._entered:
            self._entered = True  # once
            self._count_dropped()

    def _count_dropped(self) -> None:
        """The prompts that never reached the engine, counted once the run is over."""
        dropped = len(self.plan.items) - self._reached
        if dropped:
            self.metrics.abort("queue", dropped)

    def _abort_cause(self) -> AbortCause:
        """Why an engine request of this run that ends unfinished, and not failed, was aborted.

        Asked as its driver ends. The run's error, when it has one, names the cause. The deadline
        cancels the drivers before its error is set (the supervisor sets it once they are done),
        so a deadline that has passed is the cause next. Else the run was left: with an exception
        (the consumer's error), or by a cancellation from outside, which is the client's unless
        the server is draining.
        """
        if self.error is not None:
            return _cause_of(self.error)
        if self._exit_error:
            return "error"
        if trio.current_time() >= self.deadline:
            return "timeout"
        return "drain" if self.draining() else "disconnect"

    def abort_all(self, error: BraidError) -> None:
        """Fail the run with ``error`` (the first error wins) and abort every driver now.

        Called from the run's own tasks, or from outside it (a drain that ran out of time); the
        consumer sees the error at its next read, so a stream still ends with an error event and
        ``[DONE]``. Not a checkpoint."""
        if self.error is None:
            self.error = error
        self._cancel_drivers()

    def _cancel_drivers(self) -> None:
        self._abort_open_requests()
        self._drivers.cancel()  # before the supervisor has entered it too: it starts cancelled

    def _abort_open_requests(self) -> None:
        # Called by whoever sees the cancellation first: an outer cancel scope (client gone,
        # drain) reaches the drivers at the same moment as the consumer, and they unwind alone.
        if self._cancelled:
            return
        self._cancelled = True
        if self._open_ids:
            self.engine.abort_requests(sorted(self._open_ids))

    async def _supervise(self, send: trio.MemorySendChannel[Arrival | Tick]) -> None:
        ticket, cost = self.ticket, self.plan.n
        items = self.plan.items
        drivers = self._drivers
        drivers.deadline = self.deadline
        try:
            with send, drivers:
                if len(items) == 1:
                    # One prompt (most requests): its driver runs in this task, inside the same
                    # scope, without a nursery and a task of its own.
                    if ticket is not None:
                        asked = trio.current_time()
                        await ticket.acquire(cost)  # the driver releases it
                        self.metrics.queue_wait.observe(trio.current_time() - asked)
                    await self._drive(items[0], send.clone())
                else:
                    async with trio.open_nursery() as inner:
                        for i, item in enumerate(items):
                            if i and i % START_CHUNK == 0:
                                # Each driver's first step (vLLM's input processing and the
                                # add) runs in the scheduler batch after its start: a chunk per
                                # batch, so 1024 of them do not hold up every other stream.
                                await trio.lowlevel.checkpoint()
                            if ticket is not None:
                                asked = trio.current_time()
                                await ticket.acquire(cost)  # the driver releases it
                                if not i:
                                    self.metrics.queue_wait.observe(trio.current_time() - asked)
                            inner.start_soon(self._drive, item, send.clone())
            if drivers.cancelled_caught and self.error is None:
                # Nothing else cancels the drivers without setting the error first or cancelling
                # this task too (then this line is never reached).
                self.error = DeadlineExceeded(
                    f"The request did not finish within its {self.settings.request_timeout:g} s "
                    "timeout; its engine work was aborted."
                )
        finally:
            # The drivers are done: the clock's clone must close too, or the channel never ends.
            if self.heartbeat is not None:
                self.heartbeat.stop()

    async def _drive(self, item: PlanItem, send: trio.MemorySendChannel[Arrival | Tick]) -> None:
        m = self.metrics
        finished = False
        failed = False  # the engine ended this request itself: an error, not an abort
        request_id = item.request.request_id
        prompt_idx = item.prompt_idx
        assert self.arrived is not None  # set on entering the run
        arrived = self.arrived
        clock = trio.lowlevel.current_clock().current_time  # trio.current_time without its lookups
        # A final_only request's one output holds the whole completion: no token to time.
        timer = None if item.request.final_only else TokenTimer(m, arrived, item.request.params.n)

        def on_failure(err: BraidError) -> None:
            # The engine knows before this driver does when the driver is blocked on a full
            # channel (its client reads nothing): abort the batch now, not when it gets there.
            nonlocal failed
            failed = True
            self.abort_all(err)

        def seen(output: EngineOutput) -> None:
            nonlocal finished
            finished = output.finished
            now = clock()
            if timer is not None:
                timer.seen(output.choices, now)
            if finished:
                m.e2e_latency.observe(now - arrived)

        def deliver(output: EngineOutput) -> bool:
            # The engine's hand-over where it makes the output (braid.engine.base): straight into
            # the channel, without waking this driver. Refused once the run is ending (an
            # aborted request's final output is not a result) and when the channel is full
            # (the driver then takes it from the iterator and waits for room, or stalls).
            if self._cancelled:
                return False
            try:
                send.send_nowait((prompt_idx, output))
            except trio.WouldBlock:
                return False
            seen(output)
            return True

        with send, self._slots(item) as ending:
            # Started in a chunk after the run was cancelled: do not open an engine request
            # only to abort it at once.
            await trio.lowlevel.checkpoint_if_cancelled()
            m.in_flight.inc()
            m.engine_requests.inc()
            self._reached += 1
            self._open_ids.add(request_id)
            try:
                observe = None if self.observe is None else self.observe(prompt_idx)
                async with self.engine.open_request(
                    item.request, on_failure, deliver, observe=observe, ending=ending
                ) as outputs:
                    try:
                        async for output in outputs:
                            seen(output)
                            arrival = (prompt_idx, output)
                            self.relayed = True
                            try:
                                send.send_nowait(arrival)  # the usual case; the engine loop checkpoints
                            except trio.WouldBlock:
                                stall = self.settings.stall_timeout
                                with trio.move_on_after(stall) as scope:
                                    await send.send(arrival)
                                if scope.cancelled_caught:
                                    raise StreamStalled(
                                        f"The client read nothing for {stall:g} s; the request was aborted."
                                    ) from None
                    except trio.Cancelled:
                        self._abort_open_requests()  # before this request's own abort, on exit
                        raise
            except StreamStalled as err:
                self.abort_all(err)
            except BraidError as err:
                # Reported by on_failure already, or raised only here (a refused add).
                failed = True
                self.abort_all(err)
            finally:
                self._open_ids.discard(request_id)
                m.in_flight.dec()
                if failed:
                    m.engine_errors.inc()
                elif not finished:
                    m.abort(self._abort_cause())

    @contextmanager
    def _slots(self, item: PlanItem) -> Iterator[Ending | None]:
        """A driver's slots (granted by the supervisor before its start), handed back as it ends,
        or earlier: when the engine says the request has at most ``handover_tokens`` of its
        ``max_tokens`` left (the :class:`~braid.engine.base.Ending` yielded, for the driver to
        pass the engine; None when there is nothing to hand on early)."""
        ticket = self.ticket
        if ticket is None:
            yield None
            return
        cost = self.plan.n
        held = True

        def hand_on() -> None:
            nonlocal held
            if held:
                held = False
                ticket.release(cost)

        lead = self.settings.handover_tokens
        max_tokens = item.request.params.max_tokens
        # n > 1: the engine counts its choices apart and says nothing; they hand on at the end.
        ending = Ending(max(1, max_tokens - lead), hand_on) if lead and cost == 1 else None
        try:
            yield ending
        finally:
            hand_on()

    async def receive_ready(self) -> list[Arrival | Tick]:
        """Wait for at least one output, then take every output that is ready (up to :data:`MAX_BATCH`).

        A streaming run's batches may hold the heartbeat's :data:`~braid.stream.heartbeat.TICK` (from
        :meth:`take_ready` too), which :meth:`Heartbeat.wait <braid.stream.heartbeat.Heartbeat.wait>`
        interprets.

        Raises :class:`trio.EndOfChannel` when every driver is done, and the run's error, if it has
        one, as soon as the consumer next asks: outputs still buffered then are dropped, as vLLM
        sends nothing after an error.
        """
        assert self._recv is not None
        if self.error is not None:
            raise self.error
        try:
            first = await self._recv.receive()
        except trio.EndOfChannel:
            self._raise_if_failed()
            raise
        if self.error is not None:
            raise self.error
        batch = [first]
        self._drain_into(batch)
        return batch

    def take_ready(self) -> list[Arrival | Tick]:
        """Every output that is ready now (up to :data:`MAX_BATCH`), without waiting: ``[]`` if none.

        Raises like :meth:`receive_ready`: the run's error first, then :class:`trio.EndOfChannel`
        once every driver is done and nothing is left. Not a checkpoint.
        """
        assert self._recv is not None
        if self.error is not None:
            raise self.error
        batch: list[Arrival | Tick] = []
        try:
            batch.append(self._recv.receive_nowait())
        except trio.WouldBlock:
            return batch
        except trio.EndOfChannel:
            self._raise_if_failed()
            raise
        self._drain_into(batch)
        return batch

    def _raise_if_failed(self) -> None:
        """At the end of the channel: a run whose drivers ended because of an error raises it."""
        if self.error is not None:
            raise self.error from None

    def _drain_into(self, batch: list[Arrival | Tick]) -> None:
        assert self._recv is not None
        receive_nowait = self._recv.receive_nowait
        try:
            while len(batch) < MAX_BATCH:
                batch.append(receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            pass


def _cause_of(error: BraidError) -> AbortCause:
    if isinstance(error, DrainTimeout):
        return "drain"
    if isinstance(error, StreamStalled):
        return "stall"
    if isinstance(error, DeadlineExceeded):
        return "timeout"
    return "error"


def _the_exception(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The exception a group from the run's nursery stands for: its one exception that is not a
    ``Cancelled`` (the consumer's error, or a bug), else its first ``Cancelled`` (which the
    cancel scope that caused it catches). Several errors at once are raised as the group."""
    leaves: list[BaseException] = []
    stack: list[BaseException] = [group]
    while stack:
        exc = stack.pop()
        if isinstance(exc, BaseExceptionGroup):
            stack.extend(reversed(exc.exceptions))
        else:
            leaves.append(exc)
    errors = [e for e in leaves if not isinstance(e, trio.Cancelled)]
    if len(errors) > 1:
        return group
    return errors[0] if errors else leaves[0]


__all__ = ["MAX_BATCH", "START_CHUNK", "CompletionRun"]
