"""The Trio side of the engine-core client that needs no vLLM: the per-request output slot.

The client itself (pump, aborts, a dead engine) runs against the real engine in tests/vllm.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from braid.engine.vllm_core import OutputSlot
from braid.errors import EngineError, EngineUnavailable


class Out:
    """Stands in for vLLM's RequestOutput: ``add`` is what vLLM's collector merges with."""

    def __init__(self, *tokens: int, finished: bool = False) -> None:
        self.tokens = list(tokens)
        self.finished = finished
        self.merges: list[bool] = []

    def add(self, other: Out, *, aggregate: bool) -> None:
        self.merges.append(aggregate)
        self.finished = other.finished
        self.tokens = self.tokens + other.tokens if aggregate else other.tokens


async def test_a_ready_output_is_returned_without_yielding_to_the_scheduler() -> None:
    slot = OutputSlot(aggregate=True)
    first = Out(1)
    slot.put(first)
    ran: list[bool] = []

    async def other() -> None:
        ran.append(True)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)  # would run at any schedule point
        got = await slot.get()
        assert ran == []
    assert got == [first] and ran == [True]


async def test_a_cancelled_reader_gets_cancelled_even_with_output_ready() -> None:
    slot = OutputSlot(aggregate=True)
    ready = Out(1, finished=True)  # e.g. vLLM's "abort" output, put as the run cancels its readers
    slot.put(ready)
    with trio.CancelScope() as scope:
        scope.cancel()
        await slot.get()
    assert scope.cancelled_caught
    assert await slot.get() == [ready]


async def test_a_reader_woken_and_cancelled_in_the_same_step_gets_cancelled() -> None:
    slot = OutputSlot(aggregate=True)
    outcome: list[str] = []

    async def reader(scope_box: list[trio.CancelScope]) -> None:
        with trio.CancelScope() as scope:
            scope_box.append(scope)
            await slot.get()
            outcome.append("output")
        if scope.cancelled_caught:
            outcome.append("cancelled")

    box: list[trio.CancelScope] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader, box)
        await trio.testing.wait_all_tasks_blocked()
        slot.put(Out(1, finished=True))  # wakes the reader ...
        box[0].cancel()  # ... which is cancelled before it runs again
    assert outcome == ["cancelled"]


async def test_outputs_put_while_the_reader_lags_merge_into_one() -> None:
    slot = OutputSlot(aggregate=True)
    slot.put(Out(1))
    slot.put(Out(2, 3))
    slot.put(Out(4))
    (got,) = await slot.get()
    assert got.tokens == [1, 2, 3, 4] and got.merges == [True, True]


async def test_the_stream_ends_after_the_finished_output() -> None:
    slot = OutputSlot(aggregate=True)
    slot.put(Out(1))
    slot.put(Out(2, finished=True))
    (got,) = await slot.get()
    assert got.tokens == [1, 2] and got.finished
    with pytest.raises(trio.EndOfChannel):
        await slot.get()
    with pytest.raises(trio.EndOfChannel):
        await slot.get()


async def test_final_only_outputs_replace_rather_than_concatenate() -> None:
    slot = OutputSlot(aggregate=False)
    slot.put(Out(1))
    slot.put(Out(1, 2))
    (got,) = await slot.get()
    assert got.tokens == [1, 2] and got.merges == [False]


async def test_a_waiting_reader_is_woken_by_put() -> None:
    slot = OutputSlot(aggregate=True)
    got: list[object] = []

    async def reader() -> None:
        got.extend(await slot.get())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []
        out = Out(7)
        slot.put(out)
    assert got == [out]


async def test_cancelling_a_wait_loses_nothing() -> None:
    slot = OutputSlot(aggregate=True)
    with trio.move_on_after(0.01):
        await slot.get()
    slot.put(Out(5))
    (got,) = await slot.get()
    assert got.tokens == [5]


async def test_an_engine_failure_wins_over_pending_output_and_is_mapped() -> None:
    pytest.importorskip("vllm")
    from vllm.v1.engine.exceptions import EngineDeadError

    slot = OutputSlot(aggregate=True)
    slot.put(Out(1))
    slot.put(EngineDeadError())
    slot.put(Out(2))  # nothing after the failure counts
    with pytest.raises(EngineUnavailable):
        await slot.get()


async def test_an_unknown_failure_is_an_engine_error() -> None:
    pytest.importorskip("vllm")  # map_error knows vLLM's exception types
    slot = OutputSlot(aggregate=True)
    slot.put(RuntimeError("boom"))
    with pytest.raises(EngineError, match="boom"):
        await slot.get()
