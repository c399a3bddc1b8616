"""The admission (braid.stream.admit) against the model's round-robin rule A2, on one found case.

A ticket that had released every slot it held used to look like a newcomer to
``Admission._grant`` (it tested ``ticket.holds``, not whether it was ever granted slots), so the
reserve let it pass a request held back by the reserve once per prompt, not once: request B
below was granted twice while request A waited, which A2 (``model.check_server``) forbids.
Hypothesis found it in ``ConcurrentRequests`` (reserve 1) for most seeds. A newcomer is now a
ticket never granted anything (``Ticket.started``).
"""

from __future__ import annotations

import itertools

import trio
import trio.testing

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
