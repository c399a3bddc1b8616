"""The heartbeat (src/braid/stream/heartbeat.py) on its own: a clock, a channel and a consumer's waits."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from braid.stream.heartbeat import TICK, Heartbeat


async def test_a_wait_ends_with_none_after_a_whole_period(autojump_clock: trio.testing.MockClock) -> None:
    heartbeat = Heartbeat(5.0)
    send, receive = trio.open_memory_channel[object](8)

    async def batch() -> list[object]:
        return [await receive.receive()]

    async with trio.open_nursery() as nursery:
        nursery.start_soon(heartbeat.clock, send.clone())
        await trio.sleep(3)  # the clock sleeps a whole period at a time; the wait starts mid-sleep
        heartbeat.new_chunk()
        assert await heartbeat.wait(batch) is None
        assert trio.current_time() == 8  # its own period, not the clock's
        heartbeat.new_chunk()
        send.send_nowait("output")
        assert await heartbeat.wait(batch) == ["output"]
        heartbeat.stop()
    send.close()
    with trio.fail_after(1), pytest.raises(trio.EndOfChannel):  # stop() closed the clock's clone
        await receive.receive()


async def test_a_stale_tick_is_not_a_ping(autojump_clock: trio.testing.MockClock) -> None:
    heartbeat = Heartbeat(5.0)
    batches: list[list[object]] = [[TICK], ["late output"]]

    async def receive() -> list[object]:
        await trio.sleep(1)
        return batches.pop(0)

    heartbeat.new_chunk()
    assert await heartbeat.wait(receive) == ["late output"]  # the tick at t=1 came too early
    assert trio.current_time() == 2


async def test_a_resumed_idle_period_keeps_its_deadline(autojump_clock: trio.testing.MockClock) -> None:
    """Outputs that wrote nothing do not restart the period; the resumed wait ends by itself even
    though no clock ticks for it (its tick may have come with those outputs)."""
    heartbeat = Heartbeat(5.0)

    async def first() -> list[object]:
        await trio.sleep(2)
        return ["wrote nothing"]

    heartbeat.new_chunk()
    assert await heartbeat.wait(first) == ["wrote nothing"]
    assert await heartbeat.wait(trio.sleep_forever) is None  # type: ignore[arg-type]
    assert trio.current_time() == 5  # 5 s after the period began, not after the resumed wait did
    heartbeat.new_chunk()
    with trio.move_on_after(4.9):
        assert await heartbeat.wait(trio.sleep_forever) is None  # type: ignore[arg-type]
        pytest.fail("a fresh period with no clock has no deadline of its own")
