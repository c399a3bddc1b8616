"""The admission (braid.stream.admit) against the model's server rules: one found case of A2,
then a property over any interleaving of requests with priorities (A1-A3).

A ticket that had released every slot it held used to look like a newcomer to
``Admission._grant`` (it tested ``ticket.holds``, not whether it was ever granted slots), so the
reserve let it pass a request held back by the reserve once per prompt, not once: request B
below was granted twice while request A waited, which A2 (``model.check_server``) forbids.
Hypothesis found it in ``ConcurrentRequests`` (reserve 1) for most seeds. A newcomer is now a
ticket never granted anything (``Ticket.started``).
"""

from __future__ import annotations

import itertools
from typing import Any

import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from braid.errors import TooManyRequests
from braid.stream.admit import Admission, Ticket
from model import check_server


def test_a_reserve_newcomer_passes_a_waiting_request_once() -> None:
    seq = itertools.count()
    records: dict[str, list[dict[str, object]]] = {"A": [], "B": []}
    names: dict[int, str] = {}

    def observe(kind: str, ticket: Ticket, slots: int) -> None:
        records[names[id(ticket)]].append({"seq": next(seq), "t": 0.0, "kind": f"slot_{kind}", "slots": slots})

    adm = Admission(slots=4, reserve=1, observer=observe)

    async def main() -> None:
        a, b = adm.admit(), adm.admit()
        names[id(a)], names[id(b)] = "A", "B"
        await a.acquire(2)  # A's prompt 0 (n=2) runs
        async with trio.open_nursery() as nursery:
            nursery.start_soon(a.acquire, 2)  # A's prompt 1 waits: 2 free, 1 of them the reserve
            await trio.testing.wait_all_tasks_blocked()
            await b.acquire(1)  # B (n=1), a newcomer, takes one slot past A: the reserve's purpose
            nursery.start_soon(b.acquire, 1)  # B's prompt 1 queues behind A
            await trio.testing.wait_all_tasks_blocked()
            b.release(1)  # B's prompt 0 ends first: B holds nothing and passes A again
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()

    trio.run(main)
    traces = [{"records": records[k]} for k in ("A", "B")]
    violations = check_server(traces, 4)  # type: ignore[arg-type]
    assert not violations, "\n".join(map(str, violations))


def test_a_background_request_waits_while_an_interactive_one_is_held_back_by_the_reserve() -> None:
    seq = itertools.count()
    records: dict[str, list[dict[str, object]]] = {"A": [], "B": []}
    names: dict[int, str] = {}

    def observe(kind: str, ticket: Ticket, slots: int) -> None:
        records[names[id(ticket)]].append({"seq": next(seq), "t": 0.0, "kind": f"slot_{kind}", "slots": slots})

    adm = Admission(slots=4, reserve=1, observer=observe)

    async def main() -> None:
        a, b = adm.admit(), adm.admit(background=True)
        names[id(a)], names[id(b)] = "A", "B"
        await a.acquire(2)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(a.acquire, 2)  # 2 free, 1 of them the reserve: A, holding slots, waits
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(b.acquire, 1)  # 1 slot beside the reserve: B's, were A not waiting
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()

    trio.run(main)
    traces = [{"request": {}, "records": records["A"]}, {"request": {"background": True}, "records": records["B"]}]
    violations = check_server(traces, 4, 1)  # type: ignore[arg-type]
    assert not violations, "\n".join(map(str, violations))
    # while A waited (until its wait was cancelled), B was granted nothing
    a_end = min((int(r["seq"]) for r in records["A"] if r["kind"] == "slot_cancel"), default=10**9)  # type: ignore[call-overload]
    assert not [r for r in records["B"] if r["kind"] == "slot_grant" and int(r["seq"]) < a_end]  # type: ignore[call-overload]


# The admission alone, under any interleaving of requests with priorities: every request asks for
# one prompt's slots at a time (as a run does), and prompts end in any order.

_OPS = st.lists(
    st.one_of(
        # the class: 0 interactive, 1 background from its key (at admit), 2 from its body (classify)
        st.tuples(st.just("admit"), st.sampled_from([0, -1, 1, 2]), st.sampled_from([0, 0, 1, 2])),
        st.tuples(st.just("ask"), st.integers(0, 5), st.sampled_from([1, 1, 2, 3])),
        st.tuples(st.just("ask"), st.integers(0, 5), st.just(1)),
        st.tuples(st.just("release"), st.integers(0, 5), st.integers(0, 3)),
        st.tuples(st.just("close"), st.integers(0, 5), st.just(0)),
    ),
    min_size=12,
    max_size=60,
)


@given(
    ops=_OPS,
    slots=st.sampled_from([3, 4]),
    reserve=st.sampled_from([0, 1]),
    background_slots=st.sampled_from([0, 1, 2]),
)
def test_admission_alone_follows_the_server_rules(
    ops: list[tuple], slots: int, reserve: int, background_slots: int
) -> None:
    """A1 (slot bound), A2 (round-robin within a rank), A3 (a better rank that could take the
    slots is never passed) and the background class's A4-A6, on the admission's own records, for
    any sequence of admits (with priorities and classes), asks, releases of a prompt's slots and
    closes."""
    seq = itertools.count()
    traces: list[dict[str, Any]] = []
    owner: dict[int, int] = {}
    adm = Admission(slots=slots, reserve=reserve, background_slots=background_slots)

    def observe(kind: str, ticket: Ticket, cost: int) -> None:
        traces[owner[id(ticket)]]["records"].append({"seq": next(seq), "t": 0.0, "kind": f"slot_{kind}", "slots": cost})

    adm.observer = observe
    tickets: list[Ticket] = []
    granted: list[list[int]] = []  # per ticket: the slots of each prompt it runs now
    asking: set[int] = set()

    async def main() -> None:
        async with trio.open_nursery() as nursery:

            async def ask(i: int, cost: int) -> None:
                asking.add(i)
                try:
                    await tickets[i].acquire(cost)
                    granted[i].append(cost)
                finally:
                    asking.discard(i)

            for op, a, b in ops:
                if op == "admit":
                    try:
                        t = adm.admit(background=b == 1)
                    except TooManyRequests:
                        continue
                    t.classify(a, background=b == 2)
                    owner[id(t)] = len(tickets)
                    tickets.append(t)
                    granted.append([])
                    traces.append({"request": {"priority": a, "background": bool(b)}, "records": []})
                elif not tickets:
                    continue
                else:
                    i = a % len(tickets)
                    t = tickets[i]
                    # (a background request's n is at most the class's room: braid refuses a larger one)
                    fits = b <= (adm.background_room if t.background else slots)
                    if op == "ask" and not t.closed and i not in asking and fits:
                        nursery.start_soon(ask, i, b)
                    elif op == "release" and granted[i]:
                        t.release(granted[i].pop(b % len(granted[i])))
                    elif op == "close" and i not in asking:
                        t.close()
                        granted[i].clear()
                await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    violations = check_server(traces, slots, reserve, background_slots)
    assert not violations, "\n".join(map(str, violations))


def test_a7_bounds_the_engine_requests_not_near_their_end() -> None:
    """Five one-choice prompts open under four slots: a violation of A7, unless one had handed on
    (``engine_ending``) or ended before the fifth opened."""

    def trace(kinds: list[tuple[str, int]], n: int = 1) -> list[dict[str, object]]:
        return [
            {"request": {"n": n}, "records": [{"seq": s, "kind": k, "prompt": p} for s, (k, p) in enumerate(kinds)]}
        ]

    opens = [("engine_open", p) for p in range(5)]
    (violation,) = check_server(trace(opens), 4)  # type: ignore[arg-type]
    assert violation.name == "engine_bound" and "take 5 slots' worth" in violation.message
    for end in ("engine_ending", "engine_close"):
        assert not check_server(trace([*opens[:4], (end, 0), opens[4]]), 4)  # type: ignore[arg-type]
    (violation,) = check_server(trace(opens[:3], n=2), 4)  # type: ignore[arg-type]
    assert "take 6 slots' worth" in violation.message
    assert not check_server(trace(opens), 0)  # type: ignore[arg-type]
