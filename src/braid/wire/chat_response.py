"""Chat's output: ``chat.completion.chunk`` events and the ``chat.completion`` body. Pure.

Shaped as vLLM 0.32's chat server writes them (its pydantic models dumped with ``exclude_unset``):
a role chunk per choice first (and, with ``echo``, a chunk with the echoed text per choice), in
choice order, then content chunks with one choice each, a final usage chunk with ``choices: []``,
and errors as a data event. :class:`ChatEvents` is the :class:`~braid.wire.output.ChoiceEvents`
of both chat routes; everything else of the output side is shared (:mod:`braid.wire.output`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from braid.engine.tool_calls import ParsedDelta, ParsedOutput
from braid.errors import BraidError
from braid.wire.output import (
    ChatLogprobs,
    ChoiceChunk,
    CollectedChoice,
    LogprobsFragment,
    ResponseMeta,
    Usage,
    encode,
    error_event,
    sse_head,
    usage_event,
)


@attrs.frozen
class ChatShape:
    """What a chat response adds to its plan, per conversation (prompt)."""

    roles: tuple[str, ...]
    """The role of its replies."""
    echo: tuple[str, ...]
    """The text ``echo`` puts before each of its choices ("" for none)."""
    top_logprobs: int | None
    """Alternatives per token in chat's logprobs (-1: all); None: no logprobs asked."""
    hide_token_data: bool = False
    """Reasoning hidden (``include_reasoning`` false through a parser): the generated tokens'
    logprobs and ids are not shown either (they would spell it out), as vLLM's server does."""
    counts_reasoning: bool = False
    """Through a reasoning parser: continuous usage reports reasoning tokens (0 on a role chunk)."""


@attrs.frozen
class ChatPrompts:
    """What chat's role chunks and body say of the prompts (conversations), each ``n`` times."""

    token_ids: tuple[tuple[int, ...], ...]
    """Per prompt, its token ids."""
    n: int
    return_token_ids: bool
    """The role chunks and the body list token ids."""
    continuous_usage: bool
    """Every chunk, the role chunks too, carries its choice's usage so far."""


def _content(fragments: Sequence[LogprobsFragment | ChatLogprobs]) -> list[dict[str, object]]:
    """One choice's logprobs ``content``: its fragments' entries, in order."""
    out: list[dict[str, object]] = []
    for f in fragments:
        assert isinstance(f, tuple), "chat renders chat's logprobs"
        out.extend(f)
    return out


def _delta(p: ParsedDelta, *, hidden_reasoning: bool = False) -> dict[str, object]:
    """A parsed delta in vLLM's ``DeltaMessage`` field order, its empty parts left out. A call's
    first piece (the one with its id or name) is whole-shaped; later pieces carry only the
    next fragment of its arguments. ``hidden_reasoning`` (``include_reasoning`` false): a delta
    with content or call pieces says ``"reasoning": null``, as vLLM's parser sets it on every
    delta it returns then."""
    delta: dict[str, object] = {}
    if p.content:
        delta["content"] = p.content
    if p.reasoning:
        delta["reasoning"] = p.reasoning
    elif hidden_reasoning and (p.content or p.tool_calls):
        delta["reasoning"] = None
    if p.tool_calls:
        delta["tool_calls"] = [
            {
                "id": piece.id,
                "type": "function",
                "index": piece.index,
                "function": {"name": piece.name, "arguments": piece.arguments},
            }
            if piece.id is not None or piece.name is not None
            else {"index": piece.index, "function": {"arguments": piece.arguments}}
            for piece in p.tool_calls
        ]
    return delta


def _message(role: str, echo: str, text: str, whole: ParsedOutput | None) -> dict[str, object]:
    """A body's ``message`` in vLLM's ``ChatMessage`` field order (``tool_calls`` only when there
    are calls); ``echo`` goes before the content, as vLLM's."""
    content: str | None = echo + text
    reasoning = None
    message: dict[str, object] = {"role": role}
    if whole is not None:
        content = whole.content if not echo else echo + (whole.content or "")
        reasoning = whole.reasoning
    message.update(content=content, refusal=None, annotations=None, audio=None, function_call=None)
    if whole is not None and whole.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in whole.tool_calls
        ]
    message["reasoning"] = reasoning
    return message


def _usage(usage: Usage) -> dict[str, object]:
    details = None if usage.reasoning_tokens is None else {"reasoning_tokens": usage.reasoning_tokens}
    return {**usage.as_dict(), "completion_tokens_details": details}


@attrs.define
class ChatEvents:
    """Chat's events and body for one response (``/v1/chat/completions`` and its batch route)."""

    meta: ResponseMeta
    shape: ChatShape
    prompts: ChatPrompts
    _head: bytes = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._head = sse_head(self.meta, "chat.completion.chunk")

    def _event(self, choice: dict[str, object], usage: Usage | None, extra: dict[str, object] | None = None) -> bytes:
        tail = b"]"
        if extra:
            tail += b"," + encode(extra)[1:-1]
        if usage is not None:
            tail += b',"usage":' + encode(_usage(usage))
        return self._head + encode(choice) + tail + b"}\n\n"

    def _opening_usage(self, prompt_idx: int) -> Usage | None:
        if not self.prompts.continuous_usage:
            return None
        return Usage(
            len(self.prompts.token_ids[prompt_idx]), 0, reasoning_tokens=0 if self.shape.counts_reasoning else None
        )

    def opening(self) -> bytes:
        """Every choice's role chunk, then its echo chunk: what vLLM sends on the first output."""
        n, shape, with_ids = self.prompts.n, self.shape, self.prompts.return_token_ids
        parts = []
        for i, ids in enumerate(self.prompts.token_ids):
            extra: dict[str, object] = {"prompt_token_ids": ids if with_ids else None, "prompt_text": None}
            for k in range(n):
                choice = {
                    "index": i * n + k,
                    "delta": {"role": shape.roles[i], "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
                parts.append(self._event(choice, self._opening_usage(i), extra))
        for i, text in enumerate(shape.echo):
            if text:
                for k in range(n):
                    choice = {"index": i * n + k, "delta": {"content": text}, "logprobs": None, "finish_reason": None}
                    parts.append(self._event(choice, self._opening_usage(i)))
        return b"".join(parts)

    def chunk(self, c: ChoiceChunk, usage: Usage | None) -> bytes:
        choice: dict[str, object] = {
            "index": c.index,
            "delta": {"content": c.text}
            if c.parsed is None
            else _delta(c.parsed, hidden_reasoning=self.shape.hide_token_data),
            "logprobs": None if c.logprobs is None else {"content": c.logprobs},
            "finish_reason": c.finish_reason,
            "token_ids": c.token_ids,
        }
        if c.finish_reason is not None:
            choice["stop_reason"] = c.stop_reason
        return self._event(choice, usage)

    def usage(self, usage: Usage) -> bytes:
        return usage_event(self._head, usage)

    def error(self, err: BraidError) -> bytes:
        return error_event(err)

    def body(
        self, choices: Sequence[CollectedChoice], usage: Usage, kv_transfer_params: Mapping[str, Any] | None = None
    ) -> bytes:
        shape, n, meta, with_ids = self.shape, self.prompts.n, self.meta, self.prompts.return_token_ids
        # One conversation's body repeats its prompt's ids and logprobs; a batch's does not.
        single = len(self.prompts.token_ids) == 1
        first = choices[0].first if choices else None
        assert first is not None, "a body is built only when every choice has finished"
        return encode(
            {
                "id": meta.id,
                "object": "chat.completion",
                "created": meta.created,
                "model": meta.model,
                "choices": [
                    {
                        "index": index,
                        "message": _message(shape.roles[index // n], shape.echo[index // n], ch.text, ch.whole),
                        "logprobs": None
                        if shape.top_logprobs is None or shape.hide_token_data
                        else {"content": _content(ch.logprobs)},
                        "finish_reason": ch.finish_reason or "stop",
                        "stop_reason": ch.stop_reason,
                        "token_ids": ch.token_ids if with_ids and not shape.hide_token_data else None,
                        "routed_experts": None,
                    }
                    for index, ch in enumerate(choices)
                ],
                "service_tier": None,
                "system_fingerprint": None,
                "usage": usage.body(),
                "prompt_logprobs": first.prompt_logprobs if single else None,
                "prompt_token_ids": self.prompts.token_ids[0] if single and with_ids else None,
                "prompt_text": None,
                # vLLM's batch route leaves it out (null) as it does the prompt's ids
                "kv_transfer_params": kv_transfer_params if single else None,
                "ec_transfer_params": None,
                "metrics": None,
            }
        )


__all__ = ["ChatEvents", "ChatPrompts", "ChatShape"]
