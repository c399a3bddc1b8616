"""Merge: the arrival-ordered outputs of every prompt -> one response, in any route's shapes. Pure.

:class:`StreamMerger` is the streaming protocol as a state machine with two phases::

    STREAMING --feed()--> STREAMING        the route's opening events on the first feed, then
                                           one event per choice delta, global index i*n+k
    STREAMING --finish()--> DONE           [usage event] + [DONE]; every choice must have finished
    STREAMING --fail(err)--> DONE          error event + [DONE]; no usage
    DONE --anything--> ProtocolViolation   nothing is ever written after [DONE]

:class:`ResponseCollector` gathers the same chunks for a non-streaming response, which is
all-or-nothing: it is rendered only when every choice has finished.

Both are the same for every route: what differs is the route's
:class:`~braid.wire.output.ChoiceEvents` (the wire shapes) and how its
:class:`~braid.stream.render.ChoiceRenderer` renders logprobs. Neither imports trio: they are
driven by the run's consumer (:mod:`braid.routes.body`, :mod:`braid.routes.common`).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

import attrs

from braid.errors import BraidError
from braid.stream.plan import Arrival, Plan
from braid.stream.render import ChoiceRenderer
from braid.wire.output import DONE, ChoiceEvents, CollectedChoice, Usage


class ProtocolViolation(RuntimeError):
    """The merger was driven out of order: a bug in braid, never a client's fault."""


class Phase(enum.Enum):
    STREAMING = "streaming"
    DONE = "done"


def usage_of(plan: Plan, renderer: ChoiceRenderer) -> Usage:
    """The request's usage, summed over its prompts (cached tokens too: vLLM reports one prompt's)."""
    return Usage(plan.prompt_tokens, renderer.completion_tokens, renderer.cached_tokens, renderer.reasoning_tokens)


@attrs.define
class StreamMerger:
    plan: Plan
    renderer: ChoiceRenderer
    events: ChoiceEvents
    phase: Phase = Phase.STREAMING
    done: bytes = DONE
    """What ends the stream after its usage or error event: ``[DONE]`` in OpenAI's dialects;
    nothing in Anthropic's, whose own last event (``message_stop``) ends it."""
    _opened: bool = attrs.field(init=False, default=False)
    _prompt_tokens: tuple[int, ...] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._prompt_tokens = tuple(len(i.request.prompt_token_ids) for i in self.plan.items)

    def _require_streaming(self) -> None:
        if self.phase is not Phase.STREAMING:
            raise ProtocolViolation("the stream has already ended")

    def feed(self, arrivals: Iterable[Arrival]) -> bytes:
        """All events for these outputs, as one body chunk (possibly empty)."""
        self._require_streaming()
        parts = []
        if not self._opened:
            self._opened = True
            parts.append(self.events.opening())
        continuous = self.plan.continuous_usage
        chunk = self.events.chunk
        render = self.renderer.render
        for prompt_idx, output in arrivals:
            for c in render(prompt_idx, output):
                usage = (
                    Usage(self._prompt_tokens[prompt_idx], c.completion_tokens, reasoning_tokens=c.reasoning_tokens)
                    if continuous
                    else None
                )
                parts.append(chunk(c, usage))
        return b"".join(parts)

    @property
    def all_finished(self) -> bool:
        """Every choice has had its finish_reason: nothing more can be fed, :meth:`finish` may follow."""
        return self.renderer.all_finished

    def finish(self) -> bytes:
        self._require_streaming()
        if not self.renderer.all_finished:
            raise ProtocolViolation("the stream ended before every choice finished")
        self.phase = Phase.DONE
        if self.plan.include_usage:
            return self.events.usage(usage_of(self.plan, self.renderer)) + self.done
        return self.done

    def fail(self, err: BraidError) -> bytes:
        self._require_streaming()
        self.phase = Phase.DONE
        return self.events.error(err) + self.done


@attrs.define
class ResponseCollector:
    plan: Plan
    renderer: ChoiceRenderer
    events: ChoiceEvents
    _choices: list[CollectedChoice] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._choices = [CollectedChoice() for _ in range(self.plan.num_choices)]

    def feed(self, arrivals: Iterable[Arrival]) -> None:
        choices = self._choices
        for prompt_idx, output in arrivals:
            for c in self.renderer.render(prompt_idx, output):
                choices[c.index].add(c)

    def body(self) -> bytes:
        if not self.renderer.all_finished:
            raise ProtocolViolation("a non-streaming response needs every choice finished")
        return self.events.body(self._choices, usage_of(self.plan, self.renderer), self.renderer.kv_transfer_params)


__all__ = ["Phase", "ProtocolViolation", "ResponseCollector", "StreamMerger", "usage_of"]
