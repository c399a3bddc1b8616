"""Admit: the server's engine slots, shared round-robin between the requests admitted.

One :class:`Admission` per app. Every completions request gets a :class:`Ticket` from
:meth:`Admission.admit` before any tokenizing; the run then asks its ticket for slots, one prompt
at a time in prompt order (:meth:`Ticket.acquire`), opens a prompt's engine request only once its
slots are granted, and gives them back when that engine request has ended (:meth:`Ticket.release`).

The rules, all of them here:

* **Slots.** At most ``slots`` engine requests are in the engine at once, server wide; a prompt
  with ``n`` choices costs ``n`` slots (vLLM runs ``n`` sequences for it). ``slots=0``: unbounded.
* **Queue.** A ticket that has never held a slot is *queued*. :meth:`Admission.admit` refuses a
  request with :class:`~braid.errors.TooManyRequests` (429) when ``max_queued`` interactive
  tickets are queued already and the new one could not start at once; :meth:`Ticket.classify`
  refuses one turning background when ``max_queued`` background tickets are queued.
* **Round-robin.** Tickets waiting for a slot stand in one ring, each with its one next prompt.
  A freed slot goes to the ticket at the head of the ring; a ticket that wants another slot
  after that joins the ring at its tail. So a request's wait for its first slot is bounded by
  the number of requests ahead of it, not by their prompt counts; a large batch is served
  progressively, in prompt order, as slots free up.
* **Priority.** There is one ring per ``priority`` (vLLM's request field: lower is earlier,
  default 0), and the rings are served in priority order: a ticket is granted slots only when
  no ticket of a better priority waits that could take them. Equal priorities share their ring
  as above. There is no aging: while better priorities keep every slot busy, a worse one waits
  (vLLM's priority scheduler does the same; ``docs/admission.md`` says why).
* **Reserve.** The last ``reserve`` free slots go only to tickets that hold none: a newcomer
  starts at once while a large batch holds the rest, instead of waiting for a slot to free up.
  (With vLLM the engine is started with room for these; see ``docs/admission.md``.)
* **Background.** A ticket of the background class (a batch job's line, a ``service_tier:
  "flex"`` request, any request of a background key) is granted slots only when no interactive
  ticket waits, never from the reserve, and only while the background class holds at most
  ``background_slots`` slots. Its rings come after every interactive one; among them the head
  is never passed. It hands its slots back between prompts like any ticket (a running prompt
  is never aborted for an interactive one): so an interactive request's wait does not grow with
  the background backlog, and background work takes every slot interactive work leaves idle.
  Background tickets queue apart: ``max_queued`` of each class, so a background backlog never
  gets an interactive request refused.
* **Cancellation.** A cancelled :meth:`Ticket.acquire` leaves the ring and takes nothing, or
  hands back at once what was granted to it as it was cancelled. :meth:`Ticket.close` returns
  every slot the ticket still holds and drops its place in the queue; it is idempotent.

Nothing here runs a task: grants happen inside :meth:`Ticket.release`, :meth:`Ticket.close` and
:meth:`Ticket.acquire`, on the caller's stack, and wake the waiter they grant to.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Iterator

import attrs
import trio

from braid.engine.base import ModelInfo
from braid.errors import InvalidRequest, TooManyRequests
from braid.settings import Settings

Rank = tuple[bool, int]
"""Where a waiting ticket stands: its class (background after interactive), then its priority."""


def default_reserve(max_num_seqs: int) -> int:
    """The reserve for an engine that runs ``max_num_seqs`` at once: a sixteenth, at least one.

    Enough for the requests that arrive during one wave of a large batch to start in the engine's
    next step (``docs/admission.md``); small enough that the engine's per-step cost barely moves."""
    return max(1, max_num_seqs // 16)


@attrs.define(eq=False)
class Rings:
    """The waiting tickets: one round-robin ring per rank (class, then priority), best first."""

    _rings: dict[Rank, deque[Ticket]] = attrs.Factory(dict)
    _order: list[Rank] = attrs.Factory(list)
    """The ranks that have a ring, sorted: every interactive one, then the background ones, each
    by priority (lower is earlier)."""

    def __len__(self) -> int:
        return sum(len(r) for r in self._rings.values())

    def __bool__(self) -> bool:
        return bool(self._rings)

    def __iter__(self) -> Iterator[Ticket]:
        for p in self._order:
            yield from self._rings[p]

    def append(self, ticket: Ticket) -> None:
        """``ticket`` joins the tail of its rank's ring."""
        ring = self._rings.get(ticket.rank)
        if ring is None:
            ring = self._rings[ticket.rank] = deque()
            bisect.insort(self._order, ticket.rank)
        ring.append(ticket)

    def remove(self, ticket: Ticket) -> None:
        ring = self._rings[ticket.rank]
        ring.remove(ticket)
        if not ring:
            self._drop(ticket.rank)

    def _drop(self, rank: Rank) -> None:
        del self._rings[rank]
        self._order.remove(rank)

    def levels(self) -> list[tuple[Rank, deque[Ticket]]]:
        """The rings with their ranks, best first (a copy of the list: :meth:`prune` may change it)."""
        return [(r, self._rings[r]) for r in self._order]

    def prune(self) -> None:
        """Drop the rings a grant scan has emptied."""
        for p in [p for p in self._order if not self._rings[p]]:
            self._drop(p)


@attrs.define(eq=False)
class Admission:
    slots: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    """Engine requests in the engine at once, server wide (0: unbounded)."""
    max_queued: int = attrs.field(default=256, validator=attrs.validators.ge(0))
    """Requests that may wait for their first slot."""
    reserve: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    """Free slots kept for requests that hold none."""
    retry_after: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    """Seconds a refused client is told to wait (the ``Retry-After`` header)."""
    background_slots: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    """Slots the background class may hold at once (0: every slot but the reserve)."""
    observer: Callable[[str, Ticket, int], None] | None = None
    """Told of every ``"ask"``, ``"grant"``, ``"cancel"`` (of an ask) and ``"release"``, with the ticket and the slots, at the
    moment it happens (the property suite records them for the model; None in production)."""
    in_use: int = 0
    """Slots granted now."""
    queued: int = 0
    """Interactive tickets that have never held a slot (and are not closed)."""
    queued_background: int = 0
    """Background tickets that have never held a slot (and are not closed)."""
    background_in_use: int = 0
    """Slots granted to background tickets now (part of ``in_use``)."""
    _ring: Rings = attrs.Factory(lambda: Rings())

    def admit(self, *, background: bool = False) -> Ticket:
        """A ticket for one request, or :class:`TooManyRequests` when its class's queue is full.

        ``background``: the request is of the background class already (its API key's). A
        request that could start at once is never refused: only one that would wait behind a
        full queue."""
        queued = self.queued_background if background else self.queued
        if queued >= self.max_queued and not self._could_start_now(1):
            raise self._full(queued, "background " if background else "")
        if background:
            self.queued_background += 1
        else:
            self.queued += 1
        return Ticket(self, background=background)

    def _full(self, queued: int, kind: str) -> TooManyRequests:
        return TooManyRequests(
            f"The server is at capacity: {queued} {kind}requests are waiting for the engine. "
            f"Retry after {self.retry_after} s.",
            retry_after=self.retry_after,
        )

    @property
    def background_room(self) -> int:
        """The most slots the background class can ever hold at once (``slots`` 0: unbounded, 0 here)."""
        if not self.slots:
            return 0
        room = self.slots - self.reserve
        return min(room, self.background_slots) if self.background_slots else room

    def check_cost(self, cost: int) -> None:
        """A prompt that costs more slots than the server has can never start: a 400 naming ``n``."""
        if self.slots and cost > self.slots:
            raise InvalidRequest(
                f"n={cost} needs {cost} engine slots at once; this server has {self.slots} (--max-in-flight-requests).",
                param="n",
            )

    @property
    def waiting(self) -> int:
        """Tickets in the ring now (each waits for the slots of its next prompt)."""
        return len(self._ring)

    def _could_start_now(self, cost: int) -> bool:
        """Would an interactive newcomer wanting ``cost`` slots get them now (see :meth:`_grant`)?"""
        if not self.slots:
            return True
        free = self.slots - self.in_use
        return cost <= free and all(t._want <= free for t in self._ring if not t.background)

    def _fits(self, ticket: Ticket, cost: int) -> bool:
        if not self.slots:
            return True
        free = self.slots - self.in_use
        if ticket.background:
            # Never the reserve: a background request need not start at once, an interactive
            # newcomer must find it free.
            return cost <= free - self.reserve and self.background_in_use + cost <= self.background_room
        # The reserve is for tickets holding nothing now (a request whose n is the whole slot
        # count must be able to start its next prompt once it has handed its slots back).
        return cost <= (free - self.reserve if ticket.holds else free)

    def _grant(self) -> None:
        """Grant in ring order to every ticket whose next prompt fits.

        The scan stops at a ticket whose prompt does not fit in the free slots at all, so a
        prompt that costs many slots is not starved by cheaper ones behind it. A ticket held back
        only by the reserve (it has been granted slots before) is passed over for newcomers behind it:
        that is what the reserve is for, and each newcomer takes at most one prompt's slots from
        it before it holds slots itself. Other tickets holding slots never pass it."""
        passed = False  # a ticket held back by the reserve is behind us: only newcomers now
        try:
            # Best rank first: a worse one never passes a better one that fits.
            for rank, ring in self._ring.levels():
                background = rank[0]
                if background and passed:
                    return  # an interactive ticket still waits: no slot goes to the background class
                i = 0
                while i < len(ring):
                    ticket = ring[i]
                    # Only a request never granted anything may pass: one that has been, and has
                    # handed its slots back between two prompts, holds none but is no newcomer
                    # (A2: it would pass a waiting holder once per prompt).
                    if (not passed or not ticket.started) and self._fits(ticket, ticket._want):
                        del ring[i]
                        self._take(ticket, ticket._want)
                        ticket._want = 0
                        assert ticket._event is not None
                        ticket._event.set()
                    elif background or ticket._want > self.slots - self.in_use:
                        return  # the background class's head is never passed
                    else:
                        passed = True
                        i += 1
        finally:
            self._ring.prune()

    def _take(self, ticket: Ticket, cost: int) -> None:
        if self.observer is not None:
            self.observer("grant", ticket, cost)
        if not ticket.started:
            ticket.started = True
            self._unqueue(ticket)
        self.in_use += cost
        ticket.holds += cost
        if ticket.background:
            self.background_in_use += cost

    def _unqueue(self, ticket: Ticket) -> None:
        if ticket.background:
            self.queued_background -= 1
        else:
            self.queued -= 1

    def _give_back(self, ticket: Ticket, cost: int) -> None:
        self.in_use -= cost
        ticket.holds -= cost
        if ticket.background:
            self.background_in_use -= cost


def admission_for(settings: Settings, info: ModelInfo) -> Admission:
    """The app's admission from its settings, defaulting to the engine's own running cap.

    With no ``max_in_flight`` setting, braid admits what the engine runs at once (vLLM's
    ``max_num_seqs``, which already includes the room braid added for the reserve), so nothing
    braid hands over waits in vLLM's own first-come-first-served queue. An engine without a cap
    (the scripted one) is unbounded unless a cap is set."""
    slots = settings.max_in_flight if settings.max_in_flight is not None else (info.max_num_seqs or 0)
    reserve = settings.reserve if settings.reserve is not None else info.reserved_seqs
    if slots:
        reserve = min(reserve, slots - 1)  # a request holding slots can always get one more
    else:
        reserve = 0
    return Admission(
        slots=slots, max_queued=settings.max_queued, reserve=reserve, background_slots=settings.background_slots
    )


@attrs.define(eq=False)
class Ticket:
    """One request's share of the slots. Its owner (the run) acquires one prompt at a time."""

    admission: Admission
    holds: int = 0
    """Slots this ticket holds now."""
    started: bool = False
    """It has held a slot (it no longer counts as queued)."""
    closed: bool = False
    priority: int = 0
    """The request's ``priority`` (lower is earlier): which ring it waits in. Set once the body
    is read (:meth:`classify`), before its first prompt asks for slots."""
    background: bool = False
    """Of the background class (:meth:`classify`): granted only slots interactive work leaves."""
    _want: int = 0
    _event: trio.Event | None = None

    @property
    def rank(self) -> Rank:
        return (self.background, self.priority)

    def classify(self, priority: int, *, background: bool = False, cost: int = 1) -> None:
        """The request's priority and class, known once its body is read (the ticket is issued
        before), and ``cost``, its prompts' slots each. A ticket of the background class stays
        there (a background key's request cannot leave it by what it sends).

        Turning background, it leaves the interactive queue for the background one:
        :class:`~braid.errors.TooManyRequests` when that is full, :class:`~braid.errors.InvalidRequest`
        (naming ``n``) when ``cost`` is more than the background class may ever hold. Either way
        the ticket is unchanged and still the caller's to close."""
        assert self._want == 0 and not self.started, "a ticket is classified before it asks for slots"
        adm = self.admission
        turning = background and not self.background
        room = adm.background_room
        if (turning or self.background) and room and cost > room:
            raise InvalidRequest(
                f"n={cost} needs {cost} engine slots at once; this server gives background requests "
                f"at most {room} (--batch-max-slots, --admission-reserve).",
                param="n",
            )
        if turning:
            if adm.queued_background >= adm.max_queued:
                raise adm._full(adm.queued_background, "background ")
            adm.queued -= 1
            adm.queued_background += 1
            self.background = True
        self.priority = priority

    async def acquire(self, cost: int) -> None:
        """Wait until ``cost`` slots are granted to this ticket.

        Returns at once, without a checkpoint, when nobody is waiting and the slots are free.
        Otherwise waits its turn in the ring (a checkpoint even if the turn comes at once).
        Cancelled, it takes nothing: slots granted at the same moment are handed back before
        :class:`trio.Cancelled` propagates."""
        adm = self.admission
        assert not self.closed, "acquire on a closed ticket"
        assert self._want == 0, "one acquire at a time"
        if adm.observer is not None:
            adm.observer("ask", self, cost)
        if not adm._ring and adm._fits(self, cost):
            adm._take(self, cost)
            return
        self._want = cost
        self._event = event = trio.Event()
        adm._ring.append(self)
        adm._grant()  # the reserve may be this newcomer's though others wait
        try:
            await event.wait()
        except BaseException:
            if event.is_set():  # granted as it was cancelled: hand the slots back
                self.release(cost)
            else:
                if adm.observer is not None:
                    adm.observer("cancel", self, cost)
                adm._ring.remove(self)
                self._want = 0
                adm._grant()  # a head that could not fit may have been this one
            raise
        finally:
            self._event = None

    def release(self, cost: int) -> None:
        """Hand back ``cost`` slots (a prompt's engine request ended), granting them on at once."""
        assert 0 < cost <= self.holds
        if self.admission.observer is not None:
            self.admission.observer("release", self, cost)
        self.admission._give_back(self, cost)
        self.admission._grant()

    def close(self) -> None:
        """Hand back every slot still held and leave the queue. Idempotent."""
        if self.closed:
            return
        self.closed = True
        adm = self.admission
        if self._want:
            if adm.observer is not None:
                adm.observer("cancel", self, self._want)
            adm._ring.remove(self)
            self._want = 0
        if not self.started:
            self.started = True
            adm._unqueue(self)
        if self.holds:
            if adm.observer is not None:
                adm.observer("release", self, self.holds)
            adm._give_back(self, self.holds)
        adm._grant()


__all__ = ["Admission", "Rank", "Rings", "Ticket", "admission_for", "default_reserve"]
