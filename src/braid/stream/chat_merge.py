"""Merge chat: the arrival-ordered outputs of every conversation -> one chat response. Pure.

The same state machine as :class:`braid.stream.merge.StreamMerger` (STREAMING, then DONE after the
usage event and ``[DONE]``, or after an error event and ``[DONE]``), with chat's framing: the first
outputs to arrive are preceded by one role chunk per choice (and, with ``echo``, one chunk with
the echoed text per choice), in choice order, so every choice's role comes before its content.
Then each choice delta is one content chunk. Choice ``k`` of conversation ``i`` has the index
``i * n + k``, as a completions batch does.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from braid.engine.base import Tokenizer
from braid.stream.merge import ProtocolViolation, StreamMerger
from braid.stream.plan import Plan
from braid.stream.render import ChoiceRenderer, render_prompt_logprobs
from braid.stream.run import Arrival
from braid.wire.chat_response import ChatChoice, ChatSseEncoder, chat_body
from braid.wire.completions_response import Usage


@attrs.frozen
class ChatShape:
    """What a chat response adds to its plan."""

    roles: tuple[str, ...]
    """Per conversation: the role of its replies."""
    echo: tuple[str, ...]
    """Per conversation: the text ``echo`` puts before each of its choices ("" for none)."""
    top_logprobs: int | None
    """Alternatives per token in chat's logprobs (-1: all); None: no logprobs asked."""


def _renderer(plan: Plan, tokenizer: Tokenizer, shape: ChatShape) -> ChoiceRenderer:
    return ChoiceRenderer(plan, tokenizer, chat_top=0 if shape.top_logprobs is None else shape.top_logprobs)


@attrs.define
class ChatStreamMerger(StreamMerger):
    """:class:`~braid.stream.merge.StreamMerger` with chat's events: the same phases, finish and fail;
    the first :meth:`feed` opens every choice first."""

    shape: ChatShape = attrs.field(kw_only=True)
    _chat: ChatSseEncoder = attrs.field(init=False)
    """The same object as ``_sse``, typed for the role and echo chunks only chat has."""
    _opened: bool = False

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._renderer = _renderer(self.plan, self.tokenizer, self.shape)
        self._sse = self._chat = ChatSseEncoder(self.plan.meta)

    def _open(self) -> list[bytes]:
        """Every choice's role chunk, then its echo chunk: what vLLM sends on the first output."""
        plan, shape = self.plan, self.shape
        continuous = plan.continuous_usage
        parts = []
        for item in plan.items:
            usage = Usage(self._prompt_tokens[item.prompt_idx], 0) if continuous else None
            ids = item.request.prompt_token_ids if plan.return_token_ids else None
            for k in range(plan.n):
                parts.append(self._chat.role(item.prompt_idx * plan.n + k, shape.roles[item.prompt_idx], ids, usage))
        for item in plan.items:
            text = shape.echo[item.prompt_idx]
            if text:
                usage = Usage(self._prompt_tokens[item.prompt_idx], 0) if continuous else None
                for k in range(plan.n):
                    parts.append(self._chat.echo(item.prompt_idx * plan.n + k, text, usage))
        return parts

    def feed(self, arrivals: Iterable[Arrival]) -> bytes:
        """All events for these outputs, as one body chunk (possibly empty)."""
        if self._opened:
            return super().feed(arrivals)
        self._require_streaming()
        self._opened = True
        return b"".join(self._open()) + super().feed(arrivals)


@attrs.define
class _Choice:
    texts: list[str] = attrs.Factory(list)
    logprobs: list[dict[str, object]] = attrs.Factory(list)
    token_ids: list[int] = attrs.Factory(list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None


@attrs.define
class ChatResponseCollector:
    plan: Plan
    tokenizer: Tokenizer
    shape: ChatShape
    _renderer: ChoiceRenderer = attrs.field(init=False)
    _choices: list[_Choice] = attrs.field(init=False)
    _prompt_logprobs: object = None

    def __attrs_post_init__(self) -> None:
        self._renderer = _renderer(self.plan, self.tokenizer, self.shape)
        self._choices = [_Choice() for _ in range(self.plan.num_choices)]

    def feed(self, arrivals: Iterable[Arrival]) -> None:
        for prompt_idx, output in arrivals:
            if output.prompt_logprobs is not None and prompt_idx == 0:
                self._prompt_logprobs = render_prompt_logprobs(output.prompt_logprobs)
            for c in self._renderer.render(prompt_idx, output):
                choice = self._choices[c.index]
                choice.texts.append(c.text)
                if c.chat_logprobs is not None:
                    choice.logprobs.extend(c.chat_logprobs)
                if c.token_ids is not None:
                    choice.token_ids.extend(c.token_ids)
                if c.finish_reason is not None:
                    choice.finish_reason, choice.stop_reason = c.finish_reason, c.stop_reason

    def body(self) -> bytes:
        if not self._renderer.all_finished:
            raise ProtocolViolation("a non-streaming response needs every choice finished")
        plan, shape = self.plan, self.shape
        choices = [
            ChatChoice(
                index=index,
                role=shape.roles[index // plan.n],
                content=shape.echo[index // plan.n] + "".join(ch.texts),
                logprobs=tuple(ch.logprobs) if shape.top_logprobs is not None else None,
                finish_reason=ch.finish_reason,
                stop_reason=ch.stop_reason,
                token_ids=tuple(ch.token_ids) if plan.return_token_ids else None,
            )
            for index, ch in enumerate(self._choices)
        ]
        single = len(plan.items) == 1
        return chat_body(
            plan.meta,
            choices,
            _usage(plan, self._renderer),
            prompt_token_ids=plan.items[0].request.prompt_token_ids if single and plan.return_token_ids else None,
            prompt_logprobs=self._prompt_logprobs if single else None,
        )


def _usage(plan: Plan, renderer: ChoiceRenderer) -> Usage:
    return Usage(plan.prompt_tokens, renderer.completion_tokens, renderer.cached_tokens)


__all__ = ["ChatResponseCollector", "ChatShape", "ChatStreamMerger"]
