"""The Trio <-> asyncio bridge (src/braid/engine/asyncio_bridge.py) against a fake asyncio engine.

Real threads, so the real clock (the mock clock would fire timeouts while the asyncio side works).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import attrs
import pytest
import trio

from braid.engine.asyncio_bridge import AsyncioThread, open_asyncio_thread
from braid.errors import EngineError


@attrs.define
class FakeEngine:
    """An asyncio 'engine' whose generate() records produced items and aborts, like AsyncLLM."""

    produced: dict[str, int] = attrs.Factory(dict)
    aborted: list[str] = attrs.Factory(list)
    finished: list[str] = attrs.Factory(list)
    threads: set[str] = attrs.Factory(set)

    async def generate(
        self, rid: str, count: int, delay: float = 0.0, fail_at: int | None = None
    ) -> AsyncIterator[int]:
        self.threads.add(threading.current_thread().name)
        self.produced[rid] = 0
        try:
            for i in range(count):
                await asyncio.sleep(delay)
                if i == fail_at:
                    raise ValueError(f"boom at {i}")
                self.produced[rid] += 1
                yield i
            self.finished.append(rid)
        except (asyncio.CancelledError, GeneratorExit):
            self.aborted.append(rid)  # AsyncLLM calls abort(request_id) here
            raise


async def _collect(bridge: AsyncioThread, agen_factory) -> list[int]:  # type: ignore[no-untyped-def]
    got: list[int] = []
    async with bridge.open_stream(agen_factory) as stream:
        while True:
            try:
                got.extend(await stream.receive_batch())
            except trio.EndOfChannel:
                return got


async def test_items_arrive_in_order_on_the_asyncio_thread() -> None:
    engine = FakeEngine()
    async with open_asyncio_thread() as bridge:
        got = await _collect(bridge, lambda: engine.generate("a", 500))
    assert got == list(range(500))
    assert engine.finished == ["a"] and engine.aborted == []
    assert engine.threads == {"braid-asyncio"}


async def test_many_concurrent_streams() -> None:
    engine = FakeEngine()
    results: dict[int, list[int]] = {}
    async with open_asyncio_thread() as bridge:
        async with trio.open_nursery() as nursery:
            for k in range(32):

                async def one(k: int = k) -> None:
                    results[k] = await _collect(bridge, lambda: engine.generate(f"r{k}", 50 + k))

                nursery.start_soon(one)
    assert all(results[k] == list(range(50 + k)) for k in range(32))
    assert len(engine.finished) == 32


async def test_cancel_aborts_the_generator_before_the_block_is_left() -> None:
    engine = FakeEngine()
    async with open_asyncio_thread(window=4) as bridge:
        with trio.move_on_after(0.2):
            async with bridge.open_stream(lambda: engine.generate("slow", 10_000, delay=0.001)) as stream:
                await stream.receive_batch()
                await trio.sleep_forever()
        assert engine.aborted == ["slow"]  # the abort ran before open_stream returned
        assert engine.finished == []


async def test_a_consumer_that_stops_reading_parks_the_pump_and_cancel_still_aborts() -> None:
    engine = FakeEngine()
    async with open_asyncio_thread(window=4) as bridge:
        async with bridge.open_stream(lambda: engine.generate("parked", 10_000)) as stream:
            await trio.sleep(0.2)  # never read: the pump parks on a full window
            produced = engine.produced["parked"]
            assert 4 <= produced <= 5, produced  # bounded by the window, not by the generator
            assert len(await stream.receive_batch()) == produced
        # leaving the block with the generator parked outside its frame: aclosing must abort it
        assert engine.aborted == ["parked"]


async def test_a_reader_that_keeps_up_never_wakes_the_loop() -> None:
    """The window costs no thread crossing until it fills (the old credit scheme woke the loop
    every window // 2 items: 25 times here)."""
    engine = FakeEngine()
    async with open_asyncio_thread(window=8) as bridge:
        got = await _collect(bridge, lambda: engine.generate("a", 100, delay=0.001))
        wakes = bridge._hub.loop_wakes
    assert got == list(range(100))
    assert wakes <= 2, wakes  # the stream's own cancel on exit, and slack for one stall


async def test_a_slow_reader_parks_and_resumes_the_pump_in_order() -> None:
    engine = FakeEngine()
    async with open_asyncio_thread(window=4) as bridge:
        batches: list[list[int]] = []
        async with bridge.open_stream(lambda: engine.generate("s", 60)) as stream:
            while True:
                await trio.sleep(0.005)  # the generator fills the window meanwhile
                try:
                    batches.append(await stream.receive_batch())
                except trio.EndOfChannel:
                    break
        wakes = bridge._hub.loop_wakes
    assert [i for b in batches for i in b] == list(range(60))
    assert max(len(b) for b in batches) <= 4  # never more than the window waits
    assert wakes >= 60 // 4 - 1  # each full window parked the pump, and each take resumed it
    assert engine.finished == ["s"]


async def test_generator_errors_are_mapped_and_raised_in_trio() -> None:
    engine = FakeEngine()

    def map_error(exc: BaseException) -> BaseException:
        return EngineError(f"engine failed: {exc}")

    async with open_asyncio_thread() as bridge:
        got: list[int] = []
        with pytest.raises(EngineError, match="boom at 3"):
            async with bridge.open_stream(lambda: engine.generate("f", 10, fail_at=3), map_error) as stream:
                while True:
                    got.extend(await stream.receive_batch())
        assert got == [0, 1, 2]
        assert engine.aborted == []  # a failed generator is not aborted again


async def test_run_returns_results_and_the_thread_stops_on_exit() -> None:
    async def add(a: int, b: int) -> int:
        await asyncio.sleep(0)
        return a + b

    async with open_asyncio_thread() as bridge:
        assert await bridge.run(add, 2, 3) == 5
        loop = bridge.loop
    assert loop.is_closed()
    assert not any(t.name == "braid-asyncio" and t.is_alive() for t in threading.enumerate())


async def test_run_raises_the_coroutines_exception_and_cancel_waits_for_it() -> None:
    cleaned = []

    async def fails() -> None:
        await asyncio.sleep(0)
        raise KeyError("nope")

    async def slow() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            await asyncio.sleep(0.05)  # cleanup that takes a while on the asyncio side
            cleaned.append(True)

    async with open_asyncio_thread() as bridge:
        with pytest.raises(KeyError):
            await bridge.run(fails)
        with trio.move_on_after(0.1):
            await bridge.run(slow)
        assert cleaned == [True]  # cancellation returned only after the coroutine finished
