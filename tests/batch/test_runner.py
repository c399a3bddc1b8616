"""The runner's resume point: the rows already written, a torn last row cut off."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from braid.batch.runner import _Room, read_done
from braid.batch.validate import answer_row, error_row


def test_read_done_counts_whole_rows_and_cuts_a_torn_one(tmp_path: Path) -> None:
    rows = answer_row(1, "a", 200, b"{}") + error_row(3, None, "invalid_json", "x") + answer_row(4, "a", 400, b"{}")
    path = tmp_path / "out.jsonl"
    path.write_bytes(rows + answer_row(7, "z", 200, b"{}")[:20])
    assert read_done(path) == ({1, 3, 4}, 3)
    assert path.read_bytes() == rows  # the torn row is gone, so the next append starts a line
    assert read_done(tmp_path / "none.jsonl") == (set(), 0)


async def test_the_room_is_taken_a_group_at_a_time_first_come_first_served() -> None:
    room = _Room(4)
    await room.take(3)
    got: list[str] = []

    async def take(name: str, places: int) -> None:
        await room.take(places)
        got.append(name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(take, "big", 3)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(take, "small", 1)  # fits now, but waits behind the one before it
        await trio.testing.wait_all_tasks_blocked()
        assert got == [] and room.free == 1
        room.give(2)
        await trio.testing.wait_all_tasks_blocked()
        assert got == ["big"] and room.free == 0
        room.give(1)
        await trio.testing.wait_all_tasks_blocked()
        assert got == ["big", "small"] and room.free == 0


async def test_a_cancelled_take_takes_nothing_and_lets_the_next_through() -> None:
    room = _Room(2)
    await room.take(2)
    with trio.move_on_after(0.01):
        await room.take(2)
    room.give(1)
    await room.take(1)  # the cancelled ask of 2 is not in its way
    assert room.free == 0
    room.give(2)
    assert room.free == 2
