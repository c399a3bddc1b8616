"""braid.stream.admit: slots, the queue, round-robin grants, the reserve, cancellation."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from braid.engine.base import ModelInfo
from braid.errors import InvalidRequest, TooManyRequests
from braid.settings import Settings
from braid.stream.admit import Admission, admission_for, default_reserve


async def _acquire_in_order(nursery: trio.Nursery, ticket, cost: int, log: list, name: str, times: int = 1) -> None:  # type: ignore[no-untyped-def]
    """Start a task that acquires ``times`` times in a row (as a run's supervisor does), logging each grant."""

    async def go() -> None:
        for _ in range(times):
            await ticket.acquire(cost)
            log.append(name)

    nursery.start_soon(go)
    await trio.testing.wait_all_tasks_blocked()


async def test_free_slots_are_taken_without_waiting() -> None:
    adm = Admission(slots=4)
    t = adm.admit()
    assert adm.queued == 1
    for _ in range(4):
        with trio.testing.assert_no_checkpoints():
            await t.acquire(1)
    assert (adm.in_use, t.holds, adm.queued) == (4, 4, 0)
    t.close()
    assert (adm.in_use, adm.queued) == (0, 0)


async def test_freed_slots_go_round_robin_not_by_prompt() -> None:
    adm = Admission(slots=2)
    big = adm.admit()
    await big.acquire(1)
    await big.acquire(1)
    log: list[str] = []
    async with trio.open_nursery() as nursery:
        await _acquire_in_order(nursery, big, 1, log, "big", times=3)  # the batch's next prompts
        a = adm.admit()
        await _acquire_in_order(nursery, a, 1, log, "a")
        b = adm.admit()
        await _acquire_in_order(nursery, b, 1, log, "b")
        assert adm.waiting == 3 and adm.queued == 2
        for _ in range(5):
            big.release(1) if big.holds else (a if a.holds else b).release(1)
            await trio.testing.wait_all_tasks_blocked()
    # One grant per turn: the newcomers do not wait for the batch's remaining prompts.
    assert log == ["big", "a", "b", "big", "big"]


async def test_a_better_priority_is_granted_first_and_equal_ones_share_a_ring() -> None:
    adm = Admission(slots=1)
    holder = adm.admit()
    await holder.acquire(1)
    log: list[str] = []
    async with trio.open_nursery() as nursery:
        tickets = {}
        for name, priority in (("late", 5), ("batch", 0), ("urgent", -1), ("other", 0)):
            t = tickets[name] = adm.admit()
            t.classify(priority)
            await _acquire_in_order(nursery, t, 1, log, name, times=2 if name == "batch" else 1)
        assert adm.waiting == 4
        while len(log) < 5:
            (holder if holder.holds else next(t for t in tickets.values() if t.holds)).release(1)
            await trio.testing.wait_all_tasks_blocked()
    # urgent first; the two at 0 take turns (the batch's second prompt goes behind "other");
    # the worse priority waits for both
    assert log == ["urgent", "batch", "other", "batch", "late"]
    assert adm.waiting == 0


async def test_a_worse_priority_never_passes_a_better_one_that_does_not_fit_yet() -> None:
    adm = Admission(slots=2)
    first = adm.admit()
    await first.acquire(1)
    log: list[str] = []
    async with trio.open_nursery() as nursery:
        wide = adm.admit()
        wide.classify(0)
        await _acquire_in_order(nursery, wide, 2, log, "wide")  # n=2: needs both slots
        cheap = adm.admit()
        cheap.classify(1)
        await _acquire_in_order(nursery, cheap, 1, log, "cheap")
        assert log == [] and adm.in_use == 1  # a slot is free, but the better request waits for two
        first.release(1)
        await trio.testing.wait_all_tasks_blocked()
        assert log == ["wide"]
        wide.release(2)
        await trio.testing.wait_all_tasks_blocked()
    assert log == ["wide", "cheap"]


async def test_the_head_is_not_skipped_for_a_cheaper_prompt() -> None:
    adm = Admission(slots=4)
    first = adm.admit()
    for _ in range(3):
        await first.acquire(1)
    log: list[str] = []
    async with trio.open_nursery() as nursery:
        wide = adm.admit()
        await _acquire_in_order(nursery, wide, 4, log, "n=4")
        small = adm.admit()
        await _acquire_in_order(nursery, small, 1, log, "n=1")
        assert log == []  # one slot is free, but the head needs four
        for _ in range(3):
            first.release(1)
        await trio.testing.wait_all_tasks_blocked()
        assert log == ["n=4"]
        wide.release(4)
        await trio.testing.wait_all_tasks_blocked()
    assert log == ["n=4", "n=1"]


async def test_the_reserve_is_only_for_requests_holding_nothing() -> None:
    adm = Admission(slots=4, reserve=1)
    big = adm.admit()
    for _ in range(3):
        await big.acquire(1)
    log: list[str] = []
    async with trio.open_nursery() as nursery:
        await _acquire_in_order(nursery, big, 1, log, "big")
        assert log == [] and adm.in_use == 3  # the last free slot is the reserve
        small = adm.admit()
        with trio.fail_after(1):
            await small.acquire(1)  # behind "big" in the ring, but the reserve is its own
        assert adm.in_use == 4
        big.release(1)
        small.release(1)
        await trio.testing.wait_all_tasks_blocked()
        assert log == ["big"]


async def test_a_full_queue_refuses_only_requests_that_would_wait() -> None:
    adm = Admission(slots=1, max_queued=1)
    running = adm.admit()
    await running.acquire(1)
    waiting = adm.admit()  # queued: no slot free
    with pytest.raises(TooManyRequests) as info:
        adm.admit()
    assert info.value.status == 429 and info.value.retry_after == adm.retry_after
    waiting.close()
    adm.admit().close()  # room in the queue again
    running.close()
    assert (adm.in_use, adm.queued) == (0, 0)


async def test_a_cancelled_wait_takes_nothing_and_frees_its_queue_place() -> None:
    adm = Admission(slots=1)
    holder = adm.admit()
    await holder.acquire(1)
    waiter = adm.admit()
    with trio.move_on_after(1) as scope:
        await waiter.acquire(1)
    assert scope.cancelled_caught
    assert adm.waiting == 0 and waiter.holds == 0
    waiter.close()
    holder.release(1)
    assert (adm.in_use, adm.queued) == (0, 0)


async def test_slots_granted_as_the_waiter_is_cancelled_are_handed_back() -> None:
    adm = Admission(slots=1)
    holder = adm.admit()
    await holder.acquire(1)
    waiter = adm.admit()
    async with trio.open_nursery() as nursery:

        async def wait() -> None:
            await waiter.acquire(1)
            raise AssertionError("the grant must not be seen: the task was cancelled first")

        nursery.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()  # the waiter is rescheduled with Cancelled ...
        holder.release(1)  # ... and the slot is granted to it before it runs
    assert (adm.in_use, waiter.holds, adm.waiting) == (0, 0, 0)


async def test_close_returns_everything_and_is_idempotent() -> None:
    adm = Admission(slots=3, max_queued=5)
    t = adm.admit()
    await t.acquire(2)
    t.close()
    t.close()
    assert (adm.in_use, adm.queued) == (0, 0)


def test_a_prompt_wider_than_the_server_is_a_400_naming_n() -> None:
    adm = Admission(slots=8)
    adm.check_cost(8)
    with pytest.raises(InvalidRequest) as info:
        adm.check_cost(9)
    assert info.value.param == "n" and info.value.status == 400
    Admission(slots=0).check_cost(10_000)  # unbounded


def test_defaults_follow_the_engine() -> None:
    info = ModelInfo("m", "m", max_model_len=16, vocab_size=8, max_num_seqs=68, reserved_seqs=4)
    adm = admission_for(Settings(), info)
    assert (adm.slots, adm.reserve, adm.max_queued) == (68, 4, Settings().max_queued)
    adm = admission_for(Settings(max_in_flight=2, reserve=5), info)
    assert (adm.slots, adm.reserve) == (2, 1)  # a holder can always get one more
    uncapped = ModelInfo("m", "m", max_model_len=16, vocab_size=8)
    assert admission_for(Settings(), uncapped).slots == 0
    assert default_reserve(64) == 4 and default_reserve(8) == 1


async def test_background_takes_only_slots_no_interactive_request_waits_for() -> None:
    adm = Admission(slots=4, reserve=1, background_slots=2)
    log: list[str] = []
    bg = adm.admit(background=True)
    assert (adm.queued, adm.queued_background) == (0, 1)
    inter = adm.admit()
    async with trio.open_nursery() as nursery:
        await _acquire_in_order(nursery, bg, 1, log, "bg", times=3)
        assert (log, adm.background_in_use) == (["bg", "bg"], 2)  # the cap, not the free slots
        await _acquire_in_order(nursery, inter, 2, log, "i", times=2)
        assert log[2:] == ["i"]  # 2 free: the interactive request starts at once
        bg.release(1)  # one free slot, and an interactive ask of 2 waits: the background gets none
        await trio.testing.wait_all_tasks_blocked()
        assert log[3:] == []
        inter.release(2)  # the interactive request's second prompt; the one slot left is the reserve
        await trio.testing.wait_all_tasks_blocked()
        assert log[3:] == ["i"]
        inter.release(2)  # now the background's third
        await trio.testing.wait_all_tasks_blocked()
        assert log[3:] == ["i", "bg"]
        nursery.cancel_scope.cancel()
    bg.close()
    inter.close()
    assert (adm.in_use, adm.background_in_use, adm.queued, adm.queued_background) == (0, 0, 0, 0)


async def test_background_never_takes_the_reserve() -> None:
    adm = Admission(slots=4, reserve=2)
    bg = adm.admit(background=True)
    await bg.acquire(2)
    with trio.move_on_after(1):
        await bg.acquire(1)  # 2 free, both the reserve's
        raise AssertionError("a background request took the reserve")
    newcomer = adm.admit()
    with trio.testing.assert_no_checkpoints():
        await newcomer.acquire(2)


async def test_a_background_backlog_never_gets_an_interactive_request_refused() -> None:
    adm = Admission(slots=1, max_queued=2)
    await adm.admit().acquire(1)  # the one slot is busy: newcomers would wait
    first = adm.admit(background=True)
    second = adm.admit()
    second.classify(0, background=True)  # a body asking for service_tier flex
    assert (adm.queued, adm.queued_background) == (0, 2)
    with pytest.raises(TooManyRequests, match="background"):
        adm.admit(background=True)
    adm.admit()  # the interactive queue has room
    with pytest.raises(TooManyRequests, match="background"):
        adm.admit().classify(0, background=True)
    first.close()
    assert adm.queued_background == 1


def test_a_background_n_beyond_the_class_room_is_a_400_naming_n() -> None:
    adm = Admission(slots=8, reserve=2, background_slots=4)
    assert adm.background_room == 4
    with pytest.raises(InvalidRequest) as e:
        adm.admit().classify(0, background=True, cost=5)
    assert e.value.param == "n"
    adm.admit().classify(0, background=True, cost=4)
    assert Admission(slots=8, reserve=2).background_room == 6
