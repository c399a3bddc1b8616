"""Merge: the arrival-ordered outputs of every prompt -> one OpenAI response. Pure.

:class:`StreamMerger` is the streaming protocol as a state machine with two phases::

    STREAMING --feed()--> STREAMING        one event per choice delta, global index i*n+k
    STREAMING --finish()--> DONE           [usage event] + [DONE]; every choice must have finished
    STREAMING --fail(err)--> DONE          error event + [DONE]; no usage
    DONE --anything--> ProtocolViolation   nothing is ever written after [DONE]

:class:`ResponseCollector` gathers the same fragments for a non-streaming response, which is
all-or-nothing: it is rendered only when every choice has finished.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Protocol

import attrs

from braid.engine.base import Tokenizer
from braid.errors import BraidError
from braid.stream.plan import Plan
from braid.stream.render import ChoiceChunk, ChoiceRenderer, LogprobsFragment
from braid.stream.run import Arrival
from braid.wire.completions_response import DONE, SseEncoder, Usage, completion_body


class ProtocolViolation(RuntimeError):
    """The merger was driven out of order: a bug in braid, never a client's fault."""


class Phase(enum.Enum):
    STREAMING = "streaming"
    DONE = "done"


class EventEncoder(Protocol):
    """A stream's event shapes: :class:`~braid.wire.completions_response.SseEncoder` (completions) or
    :class:`~braid.wire.chat_response.ChatSseEncoder` (chat)."""

    def chunk(self, c: ChoiceChunk, usage: Usage | None) -> bytes: ...

    def usage(self, usage: Usage) -> bytes: ...

    def error(self, err: BraidError) -> bytes: ...


@attrs.define
class StreamMerger:
    plan: Plan
    tokenizer: Tokenizer
    phase: Phase = Phase.STREAMING
    _renderer: ChoiceRenderer = attrs.field(init=False)
    _sse: EventEncoder = attrs.field(init=False)
    _prompt_tokens: tuple[int, ...] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._renderer = ChoiceRenderer(self.plan, self.tokenizer)
        self._sse = SseEncoder(self.plan.meta)
        self._prompt_tokens = tuple(len(i.request.prompt_token_ids) for i in self.plan.items)

    def _require_streaming(self) -> None:
        if self.phase is not Phase.STREAMING:
            raise ProtocolViolation("the stream has already ended")

    def feed(self, arrivals: Iterable[Arrival]) -> bytes:
        """All events for these outputs, as one body chunk (possibly empty)."""
        self._require_streaming()
        continuous = self.plan.continuous_usage
        chunk = self._sse.chunk
        parts = []
        for prompt_idx, output in arrivals:
            for c in self._renderer.render(prompt_idx, output):
                usage = Usage(self._prompt_tokens[prompt_idx], c.completion_tokens) if continuous else None
                parts.append(chunk(c, usage))
        return b"".join(parts)

    @property
    def all_finished(self) -> bool:
        """Every choice has had its finish_reason: nothing more can be fed, :meth:`finish` may follow."""
        return self._renderer.all_finished

    def finish(self) -> bytes:
        self._require_streaming()
        if not self._renderer.all_finished:
            raise ProtocolViolation("the stream ended before every choice finished")
        self.phase = Phase.DONE
        if self.plan.include_usage:
            return self._sse.usage(_usage(self.plan, self._renderer)) + DONE
        return DONE

    def fail(self, err: BraidError) -> bytes:
        self._require_streaming()
        self.phase = Phase.DONE
        return self._sse.error(err) + DONE


@attrs.define
class _Choice:
    texts: list[str] = attrs.Factory(list)
    logprobs: list[LogprobsFragment] = attrs.Factory(list)
    token_ids: list[int] = attrs.Factory(list)
    first: ChoiceChunk | None = None
    last: ChoiceChunk | None = None


def _join_logprobs(fragments: list[LogprobsFragment]) -> dict[str, object] | None:
    if not fragments:
        return None
    return {
        "text_offset": [x for f in fragments for x in f.text_offset],
        "token_logprobs": [x for f in fragments for x in f.token_logprobs],
        "tokens": [x for f in fragments for x in f.tokens],
        "top_logprobs": [x for f in fragments for x in f.top_logprobs],
    }


@attrs.define
class ResponseCollector:
    plan: Plan
    tokenizer: Tokenizer
    _renderer: ChoiceRenderer = attrs.field(init=False)
    _choices: list[_Choice] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._renderer = ChoiceRenderer(self.plan, self.tokenizer)
        self._choices = [_Choice() for _ in range(self.plan.num_choices)]

    def feed(self, arrivals: Iterable[Arrival]) -> None:
        for prompt_idx, output in arrivals:
            for c in self._renderer.render(prompt_idx, output):
                choice = self._choices[c.index]
                choice.first = choice.first or c
                choice.last = c
                choice.texts.append(c.text)
                if c.logprobs is not None:
                    choice.logprobs.append(c.logprobs)
                if c.token_ids is not None:
                    choice.token_ids.extend(c.token_ids)

    def body(self) -> bytes:
        if not self._renderer.all_finished:
            raise ProtocolViolation("a non-streaming response needs every choice finished")
        plan = self.plan
        choices = []
        for index, ch in enumerate(self._choices):
            assert ch.first is not None and ch.last is not None
            logprobs = _join_logprobs(ch.logprobs)
            if logprobs is None and plan.logprobs is not None:
                logprobs = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
            choices.append(
                {
                    "index": index,
                    "text": "".join(ch.texts),
                    "logprobs": logprobs,
                    "finish_reason": ch.last.finish_reason,
                    "stop_reason": ch.last.stop_reason,
                    "token_ids": ch.token_ids if plan.return_token_ids else None,
                    "prompt_logprobs": ch.first.prompt_logprobs,
                    "prompt_token_ids": ch.first.prompt_token_ids,
                    "routed_experts": None,
                }
            )
        return completion_body(plan.meta, choices, _usage(plan, self._renderer))


def _usage(plan: Plan, renderer: ChoiceRenderer) -> Usage:
    """The request's usage, summed over its prompts (cached tokens too: vLLM reports one prompt's)."""
    return Usage(plan.prompt_tokens, renderer.completion_tokens, renderer.cached_tokens)


__all__ = ["Phase", "ProtocolViolation", "ResponseCollector", "StreamMerger"]
