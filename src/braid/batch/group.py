"""Lines run together: several of a batch job's lines under one admission ticket and one run.

Each line of a job is a request of its own (:mod:`braid.batch.runner`), and a request alone costs
braid its own admission ticket and run, and costs the engine a gap: when its one prompt ends, its
slot goes back and the next line's request must be started before the engine has that work. A
batch request's prompts share one ticket, which holds its next prompt ready in admission's ring.
So the runner runs consecutive lines as one *group* (:func:`run_group`):

* Each line is prepared alone, by its route's own steps (:class:`~braid.routes.common.Prepare`:
  validation, rendering, tokenizing, its plan and renderer), so its answer is the one the route
  would give it alone: its own id, choices and usage. A line the route refuses there is answered
  at once with the route's error and takes no part in the run.
* The prepared lines' plans run as one plan (their prompts in line order, each engine request
  named as its own line's plan names it) under one ticket of the background class: admission
  grants the group's prompts one at a time, round-robin with every other waiting ticket.
* Each line is answered as soon as its own prompts have finished: no line waits for another.
* Lines that cannot share the run (another ``n`` or ``priority`` than the group's first line:
  one ticket has one cost and one place in the ring), and every line left unanswered when the
  group stops with an error (admission refused it, the engine failed), are given back with the
  error (:class:`Left`): the runner runs the first as a group of their own and the others each
  alone, so an error is the answer of the line that caused it, not of its neighbours.
* No ``--request-timeout``: one deadline would cover every line of the group, not each. A job's
  lines are bounded by its completion window, as the runner enforces it.
* Cancellation (a cancelled or expired job, the runner's end) aborts the group's engine requests
  as a client's disconnect aborts a request's, and propagates; the lines not yet answered are
  not. A server that starts draining ends the group at its next output with a 503 for every line
  not answered, which the runner leaves for the restart, as it leaves a line alone refused then.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from typing import cast

import attrs
import trio

from braid.batch.validate import Runnable
from braid.engine.base import Observe
from braid.errors import BraidError, EngineUnavailable, InvalidRequest
from braid.routes.common import (
    DRAINING_RETRY_AFTER,
    AppState,
    JsonResponse,
    Prepare,
    Prepared,
    admit,
    error_response,
    open_run,
)
from braid.stream.plan import Arrival, Plan, PlanItem

Answer = Callable[[Runnable, JsonResponse], Awaitable[None]]
"""Takes a line's answer (a 200 with its body, or its route's error) as soon as it has one."""


@attrs.frozen
class Left:
    """What a group did not answer, and why: ``error`` is what stopped it (None: the lines could
    not share the group's run)."""

    lines: tuple[Runnable, ...] = ()
    error: BraidError | None = None


def _joins(first: Plan, plan: Plan) -> bool:
    """Whether ``plan`` can share ``first``'s run: one ticket has one ``n``, priority and class."""
    return (plan.n, plan.priority, plan.background) == (first.n, first.priority, first.background)


def joint_plan(plans: Sequence[Plan]) -> tuple[Plan, list[tuple[int, int]]]:
    """One plan of several plans' prompts, in order, and where each of its prompts comes from:
    ``(plan, prompt index in that plan)`` by joint prompt index. The plans must share ``n``,
    ``priority`` and class (the run's ticket has one of each)."""
    first = plans[0]
    items: list[PlanItem] = []
    where: list[tuple[int, int]] = []
    for k, plan in enumerate(plans):
        if not _joins(first, plan):
            raise ValueError("plans of one run share n, priority and class")
        for item in plan.items:
            where.append((k, item.prompt_idx))
            items.append(attrs.evolve(item, prompt_idx=len(items)))
    return attrs.evolve(first, items=tuple(items)), where


async def run_group(state: AppState, prepare: Prepare, lines: Sequence[Runnable], answer: Answer) -> Left:
    """Run ``lines`` as one group (see the module): every line answered through ``answer``, except
    those given back. Raises only what cancels it."""
    try:
        ticket, arrived, _ = admit(state, "application/json", None, background=True)
    except BraidError as err:
        return Left(tuple(lines), err)
    # No --request-timeout: it would cover every line of the group, not each; a job's lines are
    # bounded by its completion window (the runner's), as a batch is.
    deadline = math.inf
    try:
        members: list[tuple[Runnable, Prepared]] = []
        apart: list[Runnable] = []
        for line in lines:
            try:
                prepared = await prepare(state, line.body, None, deadline)
                if prepared.plan.stream:  # refused when the job was made; checked again for a resumed one
                    raise InvalidRequest("stream is not supported in a batch.", param="stream")
            except BraidError as err:
                await answer(line, error_response(err))
                continue
            if members and not _joins(members[0][1].plan, prepared.plan):
                apart.append(line)
            else:
                members.append((line, prepared))
    except BaseException:
        ticket.close()
        raise
    if not members:
        ticket.close()
        return Left(tuple(apart))
    plan, where = joint_plan([p.plan for _, p in members])
    observe = None
    if any(p.observe is not None for _, p in members):

        def observe(joint_idx: int) -> Observe | None:
            k, idx = where[joint_idx]
            hook = members[k][1].observe
            return None if hook is None else hook(idx)

    try:
        run = open_run(state, plan, ticket, arrived, deadline, observe)  # closes the ticket if it raises
    except BraidError as err:
        return Left(tuple(line for line, _ in members) + tuple(apart), err)
    collectors = [p.collector() for _, p in members]
    answered = [False] * len(members)
    try:
        async with run:
            while True:
                try:
                    # A non-streaming run has no heartbeat, so its batches hold no ticks.
                    arrivals = cast("list[Arrival]", await run.receive_ready())
                except trio.EndOfChannel:
                    break
                for joint_idx, output in arrivals:
                    k, idx = where[joint_idx]
                    collector = collectors[k]
                    collector.feed(((idx, output),))
                    if collector.renderer.all_finished and not answered[k]:
                        answered[k] = True
                        line, prepared = members[k]
                        headers = (("X-Request-Id", prepared.plan.meta.id),)
                        await answer(line, JsonResponse(200, collector.body(), headers))
                if state.draining:
                    # Background work is not started while the server drains (a line alone is
                    # refused then): the rest of the group waits for the restart.
                    run.abort_all(EngineUnavailable("The server is shutting down.", retry_after=DRAINING_RETRY_AFTER))
    except BraidError as err:
        left = tuple(line for k, (line, _) in enumerate(members) if not answered[k])
        return Left(left + tuple(apart), err)
    # Every line is answered when the run ends without an error; were one not, it runs alone.
    left = tuple(line for k, (line, _) in enumerate(members) if not answered[k])
    return Left(left + tuple(apart))


__all__ = ["Answer", "Left", "joint_plan", "run_group"]
