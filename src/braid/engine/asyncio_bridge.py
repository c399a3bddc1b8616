"""Bridge: drive asyncio async generators (vLLM's ``AsyncLLM.generate``) from Trio tasks.

:func:`open_asyncio_thread` starts an asyncio event loop in a thread that braid owns and stops it
on exit. :meth:`AsyncioThread.open_stream` runs one async generator on that loop and delivers its
items to the calling Trio task:

* **Push with a window.** A pump task on the loop iterates the generator and appends each item to
  a deque, which the Trio side empties; once ``window`` items wait in the deque, the pump parks
  until the Trio side takes them (vLLM keeps merging deltas meanwhile, so nothing is lost). The
  asyncio thread never blocks on Trio, and a reader that keeps up never makes the pump park, so
  it never has to wake the loop: the window costs nothing until it is full.
* **One wake-up per burst, for all streams.** Each crossing between the threads costs a write to
  a wake-up socket and a hand-over of the GIL. An engine step yields one output for every running
  request at once, so the thread's :class:`_Hub` batches them: all the streams that got items
  before Trio next runs cost one ``TrioToken.run_sync_soon``, and all the parked pumps Trio
  releases before the loop next runs cost one ``call_soon_threadsafe``.
* **Abort.** The generator is iterated inside ``contextlib.aclosing``, so cancelling the pump
  closes the generator even while the pump is parked; vLLM's ``generate`` then aborts
  the request. Leaving :meth:`open_stream`'s block early cancels the pump and waits (shielded,
  at most ``abort_timeout`` seconds) until the pump has finished: when the block is left, the
  abort has run.
* **Batched clean-up.** The pumps that Trio cancels before the loop next runs are cancelled by
  one ``call_soon_threadsafe``, like the resumed pumps, and the pumps that finish before Trio
  next runs are reported in the same single wake-up as new items.
  :meth:`AsyncioThread.start_soon` starts a coroutine that nobody waits for (vLLM's batch abort,
  which only gets ahead of what each pump's own clean-up does anyway); the loop holds it until it
  is done and logs its failure.
* **Errors.** An exception from the generator is raised in the Trio task by ``map_error(exc)``,
  which turns engine exceptions into braid's error types.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Generic, TypeVar

import attrs
import trio

T = TypeVar("T")
R = TypeVar("R")

_END = object()

log = logging.getLogger(__name__)


@attrs.frozen
class _Failure:
    exc: BaseException


@attrs.define(eq=False)
class _Hub:
    """The wake-ups between one asyncio thread and Trio, batched over every stream."""

    loop: asyncio.AbstractEventLoop
    token: trio.lowlevel.TrioToken
    _lock: threading.Lock = attrs.Factory(threading.Lock)
    _ready: list[_Stream[Any]] = attrs.Factory(list)
    _done: list[_Stream[Any]] = attrs.Factory(list)
    _trio_wake_pending: bool = False
    _resumes: list[asyncio.Future[None]] = attrs.Factory(list)
    _cancels: list[_Stream[Any]] = attrs.Factory(list)
    _loop_wake_pending: bool = False
    loop_wakes: int = 0  # call_soon_threadsafe calls made (tests count them)

    def stream_ready(self, stream: _Stream[Any]) -> None:
        """asyncio thread: ``stream`` has new items; wake its Trio reader (soon)."""
        self._for_trio(self._ready, stream)

    def stream_finished(self, stream: _Stream[Any]) -> None:
        """asyncio thread: ``stream``'s pump has finished; tell whoever waits for it (soon).

        Batched like new items: when a batch is aborted, its pumps all finish in one loop pass.
        """
        self._for_trio(self._done, stream)

    def _for_trio(self, bucket: list[_Stream[Any]], stream: _Stream[Any]) -> None:
        with self._lock:
            bucket.append(stream)
            if self._trio_wake_pending:
                return
            self._trio_wake_pending = True
        try:
            self.token.run_sync_soon(self._wake_readers)
        except trio.RunFinishedError:
            pass

    def _wake_readers(self) -> None:
        with self._lock:
            ready, self._ready = self._ready, []
            done, self._done = self._done, []
            self._trio_wake_pending = False
        for stream in ready:
            stream.wake()
        for stream in done:
            stream.finished.set()

    def resume(self, parked: asyncio.Future[None]) -> None:
        """Trio thread: a parked pump's items were taken; let it go on (soon)."""
        self._for_loop(self._resumes, parked)

    def cancel(self, stream: _Stream[Any]) -> None:
        """Trio thread: cancel ``stream``'s pump (soon)."""
        self._for_loop(self._cancels, stream)

    def _for_loop(self, bucket: list[Any], item: object) -> None:
        with self._lock:
            bucket.append(item)
            if self._loop_wake_pending:
                return
            self._loop_wake_pending = True
        self.loop_wakes += 1
        self.loop.call_soon_threadsafe(self._on_loop)

    def _on_loop(self) -> None:
        with self._lock:
            resumes, self._resumes = self._resumes, []
            cancels, self._cancels = self._cancels, []
            self._loop_wake_pending = False
        for parked in resumes:
            if not parked.done():  # a pump cancelled while parked has cancelled its future
                parked.set_result(None)
        for stream in cancels:
            stream.cancel_pump()


@attrs.define(eq=False)
class _Stream(Generic[T]):
    """One generator's items, crossing from the asyncio thread to one Trio task."""

    _hub: _Hub
    _window: int
    _map_error: Callable[[BaseException], BaseException]
    _items: collections.deque[object] = attrs.Factory(collections.deque)
    _lock: threading.Lock = attrs.Factory(threading.Lock)
    _wakeup: trio.Event = attrs.Factory(trio.Event)
    _wakeup_pending: bool = False
    _parked: asyncio.Future[None] | None = None  # the pump waits on it while the window is full
    _ended: bool = False
    _failure: BaseException | None = None
    _task: asyncio.Task[None] | None = None
    _cancelled: bool = False
    finished: trio.Event = attrs.Factory(trio.Event)  # set (on Trio) when the pump has finished

    # ---- asyncio thread

    async def run(self, make_agen: Callable[[], AsyncIterator[T]]) -> None:
        """The pump task's body; always tells the Trio side when it has finished."""
        try:
            if self._cancelled:
                return  # cancelled before it started: no generator was made
            self._task = asyncio.current_task()
            await self._pump(make_agen())
        finally:
            self._hub.stream_finished(self)

    def cancel_pump(self) -> None:
        """On the loop: cancel the pump (or make sure it never starts)."""
        self._cancelled = True
        if self._task is not None:
            self._task.cancel()

    async def _pump(self, agen: AsyncIterator[T]) -> None:
        try:
            async with contextlib.aclosing(agen) as gen:  # type: ignore[type-var]
                async for item in gen:
                    parked = self._deliver(item)
                    if parked is not None:
                        await parked
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - delivered to the Trio side, which raises it
            self._deliver(_Failure(exc))
        else:
            self._deliver(_END)

    def _deliver(self, item: object) -> asyncio.Future[None] | None:
        """Queue ``item``; returns the future to park on when that filled the window."""
        parked = None
        with self._lock:
            self._items.append(item)
            if len(self._items) >= self._window:
                parked = self._parked = self._hub.loop.create_future()
            wake = not self._wakeup_pending
            self._wakeup_pending = True
        if wake:
            self._hub.stream_ready(self)
        return parked

    # ---- Trio side

    def wake(self) -> None:
        with self._lock:
            wakeup = self._wakeup
        wakeup.set()

    async def receive_batch(self) -> list[T]:
        """Every item that is ready (at least one); raises ``trio.EndOfChannel`` at the end.

        A failure is raised after the items that came before it have been returned.
        """
        if self._failure is not None:
            failure, self._failure = self._failure, None
            self._ended = True
            raise self._map_error(failure) from failure
        if self._ended:
            raise trio.EndOfChannel
        while True:
            with self._lock:
                if self._items:
                    items = list(self._items)
                    self._items.clear()
                    parked, self._parked = self._parked, None
                    break
                self._wakeup = trio.Event()
                self._wakeup_pending = False
                wakeup = self._wakeup
            await wakeup.wait()
        if parked is not None:
            self._hub.resume(parked)
        out: list[T] = []
        for item in items:
            if item is _END:
                self._ended = True
                break
            if isinstance(item, _Failure):
                self._failure = item.exc
                break
            out.append(item)  # type: ignore[arg-type]
        if out:
            return out
        return await self.receive_batch()

    async def wait_finished(self) -> None:
        await self.finished.wait()


@attrs.define(eq=False)
class AsyncioThread:
    """An asyncio event loop running in a thread owned by braid."""

    loop: asyncio.AbstractEventLoop
    token: trio.lowlevel.TrioToken
    window: int = 8
    abort_timeout: float = 5.0
    _hub: _Hub = attrs.field(init=False)
    _unawaited: set[asyncio.Task[Any]] = attrs.Factory(set)

    def __attrs_post_init__(self) -> None:
        self._hub = _Hub(self.loop, self.token)

    def start_soon(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        """Start ``fn(*args)`` on the loop and return at once; nobody waits for it.

        Only for work whose end nothing depends on. The loop keeps a reference to the task until
        it is done (asyncio holds tasks weakly) and logs an exception instead of raising it.
        Meant for calls that finish in a moment: a task still pending when the loop stops is
        dropped with it.
        """

        def spawn() -> None:
            task = self.loop.create_task(fn(*args))
            self._unawaited.add(task)
            task.add_done_callback(self._reap)

        self.loop.call_soon_threadsafe(spawn)

    def _reap(self, task: asyncio.Task[Any]) -> None:
        self._unawaited.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("background engine call failed: %r", task.exception())

    async def run(self, fn: Callable[..., Coroutine[Any, Any, R]], *args: Any) -> R:
        """Run ``fn(*args)`` on the loop and return its result or raise its exception.

        Cancelling the calling Trio task cancels the coroutine and waits (shielded, at most
        ``abort_timeout``) until it has finished.
        """
        done = trio.Event()
        outcome: list[Any] = []
        token = self.token

        async def call() -> None:
            try:
                outcome.append((True, await fn(*args)))
            except BaseException as exc:  # noqa: BLE001 - re-raised in the Trio task
                outcome.append((False, exc))
            finally:
                try:
                    token.run_sync_soon(done.set)
                except trio.RunFinishedError:
                    pass

        fut = asyncio.run_coroutine_threadsafe(call(), self.loop)
        try:
            await done.wait()
        except BaseException:
            fut.cancel()
            with trio.CancelScope(shield=True), trio.move_on_after(self.abort_timeout):
                await done.wait()
            raise
        ok, value = outcome[0]
        if not ok:
            raise value
        return value

    @contextlib.asynccontextmanager
    async def open_stream(
        self,
        make_agen: Callable[[], AsyncIterator[T]],
        map_error: Callable[[BaseException], BaseException] = lambda e: e,
    ) -> AsyncIterator[_Stream[T]]:
        """Run ``make_agen()`` on the loop; leaving the block before its end aborts it (see module doc)."""
        stream: _Stream[T] = _Stream(self._hub, self.window, map_error)
        asyncio.run_coroutine_threadsafe(stream.run(make_agen), self.loop)
        try:
            yield stream
        finally:
            # The concurrent future of run_coroutine_threadsafe reports "done" as soon as it is
            # cancelled, before the task has run its cleanup; so cancel the task ourselves and
            # wait for the pump's own signal that it has finished.
            self._hub.cancel(stream)
            with trio.CancelScope(shield=True), trio.move_on_after(self.abort_timeout):
                await stream.wait_finished()


@contextlib.asynccontextmanager
async def open_asyncio_thread(*, window: int = 8, abort_timeout: float = 5.0) -> AsyncIterator[AsyncioThread]:
    """Start an asyncio loop in a new thread; on exit stop it and join the thread (in a worker thread)."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    def main() -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        loop.run_forever()
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()

    thread = threading.Thread(target=main, name="braid-asyncio", daemon=True)
    thread.start()
    await trio.to_thread.run_sync(ready.wait)
    try:
        yield AsyncioThread(loop, trio.lowlevel.current_trio_token(), window, abort_timeout)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(thread.join, abort_timeout)
