"""braid.http.patches.keep_alive: the keep-alive timer restarts and stops without waiting."""

from __future__ import annotations

import attrs
import trio
import trio.testing

from braid.http.patches.keep_alive import KeepAliveTimer


@attrs.define
class Group:  # what hypercorn's TaskGroup offers the timer: its nursery
    _nursery: trio.Nursery


async def test_a_restart_does_not_wait_and_cannot_be_cancelled_half_way() -> None:
    """hypercorn's timer waits for its task to start (about two scheduler rounds) under a
    lock, so a cancelled caller could leave it unarmed; this one returns at once, armed."""
    fired = trio.Event()

    async def action() -> None:
        await trio.sleep(0.05)
        fired.set()

    async with trio.open_nursery() as nursery:
        timer = KeepAliveTimer()
        with trio.CancelScope() as scope:
            scope.cancel()
            await timer.restart(Group(nursery), action)  # no checkpoint: no Cancelled
        assert not scope.cancelled_caught
        with trio.fail_after(5):
            await fired.wait()


async def test_a_restart_replaces_the_running_timer_and_a_stop_stops_it() -> None:
    fired: list[int] = []

    def action(n: int):  # type: ignore[no-untyped-def]
        async def run() -> None:
            await trio.sleep(0.05)
            fired.append(n)

        return run

    async with trio.open_nursery() as nursery:
        timer = KeepAliveTimer()
        await timer.restart(Group(nursery), action(1))
        await trio.testing.wait_all_tasks_blocked()
        await timer.restart(Group(nursery), action(2))  # before 1 fired: 1 never fires
        await timer.restart(Group(nursery), action(3))  # 2 not even started: it never fires
        await trio.sleep(0.1)
        await timer.restart(Group(nursery), action(4))
        await timer.stop()  # stopped before its task ran
    assert fired == [3]


async def test_stop_without_a_timer_does_nothing() -> None:
    await KeepAliveTimer().stop()
