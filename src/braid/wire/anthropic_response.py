"""Anthropic's output: the Messages event stream and the ``message`` body. Pure.

:class:`AnthropicEvents` is the :class:`~braid.wire.output.ChoiceEvents` of ``/v1/messages``:
the same choice stream as chat's (one choice: Anthropic has no ``n``), viewed in Anthropic's
shapes as vLLM 0.32 writes them (``vllm/entrypoints/anthropic/serving.py``, its pydantic models
dumped without their unset fields). A stream is::

    message_start
    (content_block_start, content_block_delta*, content_block_stop)*   blocks in index order
    message_delta                                                       stop_reason and usage
    message_stop

each event framed as ``event: <type>`` and ``data: <json>``, with no ``[DONE]``. One block is
open at a time: a thinking block (``thinking_delta`` s, then a ``signature_delta`` as it
closes), a text block (``text_delta`` s) or a ``tool_use`` block (``input_json_delta`` s of its
arguments); a delta of another kind closes the open block and opens the next. Text that arrives
while a call's block is open is held, and sent as a text block of its own when that block
closes (as vLLM does). An error ends the stream with one ``error`` event.

The signatures of thinking blocks are random (vLLM's ``uuid4().hex``: braid signs nothing).
Usage: ``input_tokens`` is the prompt's tokens less those read from the prefix cache, which
are ``cache_read_input_tokens`` when the server reports them (``--enable-prompt-tokens-details``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import attrs

from braid.engine.tool_calls import ParsedDelta
from braid.errors import BraidError, InvalidRequest
from braid.wire.output import ChoiceChunk, CollectedChoice, ResponseMeta, Usage, encode

MESSAGES_PATH = "/v1/messages"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
ANTHROPIC_PATHS = frozenset({MESSAGES_PATH, COUNT_TOKENS_PATH})
"""The routes that answer in Anthropic's shapes, their errors too (a 401 of :mod:`braid.http.auth`)."""

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


def error_body(err: BraidError) -> dict[str, object]:
    """Anthropic's error shape, with braid's (vLLM's) type for the error: what vLLM answers on
    this route (its ``translate_error_response``)."""
    return {"type": "error", "error": {"type": err.type, "message": err.message}}


def stop_reason(
    finish_reason: str | None, matched: str | int | None, *, tool_used: bool, tool_complete: bool
) -> tuple[StopReason | None, str | None]:
    """Chat's finish -> Anthropic's ``(stop_reason, stop_sequence)``, as vLLM maps it: ``length``
    is ``max_tokens``; a matched stop string is ``stop_sequence`` unless the calls are complete
    (a stop string that cut a call short must not run it); any call is ``tool_use`` (chat says
    ``stop`` for a forced call); else ``end_turn``."""
    if finish_reason == "length":
        return "max_tokens", None
    if finish_reason not in ("stop", "tool_calls"):
        return None, None
    if tool_complete:
        return "tool_use", None
    if isinstance(matched, str):
        return "stop_sequence", matched
    if finish_reason == "tool_calls" or tool_used:
        return "tool_use", None
    return "end_turn", None


def _usage(usage: Usage) -> dict[str, object]:
    out: dict[str, object] = {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens}
    if usage.cached_tokens is not None:
        out["input_tokens"] = max(0, usage.prompt_tokens - usage.cached_tokens)
        out["cache_read_input_tokens"] = usage.cached_tokens
    return out


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _event(kind: str, data: Mapping[str, object]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + encode(data) + b"\n\n"


@attrs.define
class _Blocks:
    """The stream's content blocks: which one is open, and what is held for later."""

    next_index: int = 0
    kind: str | None = None
    index: int = 0
    signature: str | None = None
    call_id: str | None = None
    held: list[str] = attrs.Factory(list)
    ids: dict[int, str] = attrs.Factory(dict)
    """Each call's id by its index in the choice (later pieces carry the index alone)."""
    tool_used: bool = False
    last_arguments: list[str] = attrs.Factory(list)
    finish_reason: str | None = None
    matched: str | int | None = None

    def start(self, block: dict[str, object]) -> bytes:
        self.kind = str(block["type"])
        self.index = self.next_index
        self.signature = uuid.uuid4().hex if self.kind == "thinking" else None
        self.call_id = str(block["id"]) if self.kind == "tool_use" else None
        return _event(
            "content_block_start", {"type": "content_block_start", "content_block": block, "index": self.index}
        )

    def delta(self, delta: dict[str, object]) -> bytes:
        return _event("content_block_delta", {"type": "content_block_delta", "delta": delta, "index": self.index})

    def stop(self) -> bytes:
        if self.kind is None:
            return b""
        out = b""
        if self.signature is not None:
            out += self.delta({"type": "signature_delta", "signature": self.signature})
        out += _event("content_block_stop", {"type": "content_block_stop", "index": self.index})
        self.kind = self.signature = self.call_id = None
        self.next_index += 1
        return out

    def stop_and_flush(self) -> bytes:
        """Close the open block; then the held text, as a text block of its own."""
        held = "".join(self.held)
        self.held.clear()
        out = self.stop()
        if held:
            out += self.start({"type": "text", "text": ""})
            out += self.delta({"type": "text_delta", "text": held})
            out += self.stop()
        return out

    def switch(self, block: dict[str, object]) -> bytes:
        return self.stop_and_flush() + self.start(block)

    def add(self, p: ParsedDelta) -> bytes:
        out = b""
        if p.reasoning:
            if self.kind != "thinking":
                out += self.switch({"type": "thinking", "thinking": ""})
            out += self.delta({"type": "thinking_delta", "thinking": p.reasoning})
        if p.content:
            if self.kind == "tool_use":
                self.held.append(p.content)
            else:
                if self.kind != "text":
                    out += self.switch({"type": "text", "text": ""})
                out += self.delta({"type": "text_delta", "text": p.content})
        for piece in p.tool_calls:
            if piece.id is not None:
                self.ids[piece.index] = piece.id
                if self.call_id != piece.id and piece.name is not None:
                    out += self.stop_and_flush()
                    self.tool_used = True
                    self.last_arguments = []
                    out += self.start({"type": "tool_use", "id": piece.id, "name": piece.name, "input": {}})
                call_id: str | None = piece.id
            else:
                call_id = self.ids.get(piece.index)
            if piece.arguments and call_id is not None and self.call_id == call_id:
                self.last_arguments.append(piece.arguments)
                out += self.delta({"type": "input_json_delta", "partial_json": piece.arguments})
        return out


@attrs.define
class AnthropicEvents:
    """Anthropic's events and body for one ``/v1/messages`` response (one choice)."""

    meta: ResponseMeta
    prompt_tokens: int
    _blocks: _Blocks = attrs.Factory(_Blocks)

    def opening(self) -> bytes:
        message: dict[str, object] = {
            "id": self.meta.id,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": self.meta.model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0},
        }
        return _event("message_start", {"type": "message_start", "message": message})

    def chunk(self, c: ChoiceChunk, usage: Usage | None) -> bytes:
        blocks = self._blocks
        if c.finish_reason is not None:
            blocks.finish_reason = c.finish_reason
            blocks.matched = c.stop_reason
        return blocks.add(c.parsed if c.parsed is not None else ParsedDelta(content=c.text))

    def usage(self, usage: Usage) -> bytes:
        blocks = self._blocks
        out = blocks.stop_and_flush()
        reason, sequence = stop_reason(
            blocks.finish_reason or "stop",
            blocks.matched,
            tool_used=blocks.tool_used,
            tool_complete=blocks.tool_used and _is_json("".join(blocks.last_arguments)),
        )
        out += _event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": sequence},
                "usage": _usage(usage),
            },
        )
        return out + _event("message_stop", {"type": "message_stop"})

    def error(self, err: BraidError) -> bytes:
        return _event("error", error_body(err))

    def body(
        self, choices: Sequence[CollectedChoice], usage: Usage, kv_transfer_params: Mapping[str, Any] | None = None
    ) -> bytes:
        (choice,) = choices
        whole = choice.whole
        content_text = choice.text if whole is None else whole.content
        calls = () if whole is None else whole.tool_calls
        content: list[dict[str, object]] = []
        if whole is not None and whole.reasoning:
            content.append({"type": "thinking", "thinking": whole.reasoning, "signature": uuid.uuid4().hex})
        if content_text:
            content.append({"type": "text", "text": content_text})
        for call in calls:
            try:
                arguments = json.loads(call.arguments)
            except ValueError:
                # vLLM's answer too (a 400): the call was cut, by max_tokens or a stop string
                raise InvalidRequest(
                    f"The model's call of {call.name!r} ended before its arguments were whole JSON "
                    "(cut by max_tokens or a stop sequence): raise max_tokens, or stream to see the partial call."
                ) from None
            content.append({"type": "tool_use", "id": call.id, "name": call.name, "input": arguments})
        if not content:
            content.append({"type": "text", "text": ""})  # Anthropic's shape of an empty answer
        reason, sequence = stop_reason(
            choice.finish_reason or "stop", choice.stop_reason, tool_used=bool(calls), tool_complete=bool(calls)
        )
        out: dict[str, object] = {
            "id": self.meta.id,
            "type": "message",
            "role": "assistant",
            "content": content,
            "model": self.meta.model,
        }
        if reason is not None:
            out["stop_reason"] = reason
        if sequence is not None:
            out["stop_sequence"] = sequence
        out["usage"] = _usage(usage)
        if kv_transfer_params is not None:
            out["kv_transfer_params"] = kv_transfer_params
        return encode(out)


__all__ = ["ANTHROPIC_PATHS", "COUNT_TOKENS_PATH", "MESSAGES_PATH", "AnthropicEvents", "error_body", "stop_reason"]
