"""Encode chat: choice chunks and usage -> ``chat.completion.chunk`` events or a ``chat.completion``.

Pure, and shaped as vLLM 0.32's chat server writes them (its pydantic models dumped with
``exclude_unset``): a role chunk per choice, content chunks with one choice each, a final usage
chunk with ``choices: []``, and errors as a data event. The constant head of every chunk is
encoded once per request, as in :mod:`braid.wire.completions_response`.
"""

from __future__ import annotations

import attrs
import msgspec

from braid.errors import BraidError
from braid.stream.plan import ResponseMeta
from braid.stream.render import ChoiceChunk
from braid.wire.completions_response import SseEncoder, Usage

_encode = msgspec.json.Encoder().encode


def _usage(usage: Usage) -> dict[str, object]:
    return {**usage.as_dict(), "completion_tokens_details": None}


@attrs.define
class ChatSseEncoder:
    meta: ResponseMeta
    _head: bytes = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        head = _encode(
            {
                "id": self.meta.id,
                "object": "chat.completion.chunk",
                "created": self.meta.created,
                "model": self.meta.model,
            }
        )
        self._head = b"data: " + head[:-1] + b',"choices":['

    def _event(self, choice: dict[str, object], usage: Usage | None, extra: dict[str, object] | None = None) -> bytes:
        tail = b"]"
        if extra:
            tail += b"," + _encode(extra)[1:-1]
        if usage is not None:
            tail += b',"usage":' + _encode(_usage(usage))
        return self._head + _encode(choice) + tail + b"}\n\n"

    def role(self, index: int, role: str, prompt_token_ids: tuple[int, ...] | None, usage: Usage | None) -> bytes:
        choice = {"index": index, "delta": {"role": role, "content": ""}, "logprobs": None, "finish_reason": None}
        return self._event(choice, usage, {"prompt_token_ids": prompt_token_ids, "prompt_text": None})

    def echo(self, index: int, text: str, usage: Usage | None) -> bytes:
        choice = {"index": index, "delta": {"content": text}, "logprobs": None, "finish_reason": None}
        return self._event(choice, usage)

    def chunk(self, c: ChoiceChunk, usage: Usage | None) -> bytes:
        choice: dict[str, object] = {
            "index": c.index,
            "delta": {"content": c.text},
            "logprobs": None if c.chat_logprobs is None else {"content": c.chat_logprobs},
            "finish_reason": c.finish_reason,
            "token_ids": c.token_ids,
        }
        if c.finish_reason is not None:
            choice["stop_reason"] = c.stop_reason
        return self._event(choice, usage)

    def usage(self, usage: Usage) -> bytes:
        body: dict[str, object] = {**usage.as_dict()}
        if usage.cached_tokens is not None:
            body["prompt_tokens_details"] = {"cached_tokens": usage.cached_tokens}
        return self._head + b'],"usage":' + _encode(body) + b"}\n\n"

    @staticmethod
    def error(err: BraidError) -> bytes:
        return SseEncoder.error(err)


@attrs.frozen
class ChatChoice:
    """One finished choice of a non-streamed answer."""

    index: int
    role: str
    content: str
    logprobs: tuple[dict[str, object], ...] | None
    finish_reason: str | None
    stop_reason: str | int | None
    token_ids: tuple[int, ...] | None


def chat_body(
    meta: ResponseMeta,
    choices: list[ChatChoice],
    usage: Usage,
    *,
    prompt_token_ids: tuple[int, ...] | None,
    prompt_logprobs: object,
) -> bytes:
    details = None
    if usage.cached_tokens is not None:
        details = {"cached_tokens": usage.cached_tokens, "created_cache_tokens": None, "multimodal_tokens": None}
    return _encode(
        {
            "id": meta.id,
            "object": "chat.completion",
            "created": meta.created,
            "model": meta.model,
            "choices": [
                {
                    "index": c.index,
                    "message": {
                        "role": c.role,
                        "content": c.content,
                        "refusal": None,
                        "annotations": None,
                        "audio": None,
                        "function_call": None,
                        "reasoning": None,
                    },
                    "logprobs": None if c.logprobs is None else {"content": c.logprobs},
                    "finish_reason": c.finish_reason or "stop",
                    "stop_reason": c.stop_reason,
                    "token_ids": c.token_ids,
                    "routed_experts": None,
                }
                for c in choices
            ],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": {**usage.as_dict(), "prompt_tokens_details": details, "completion_tokens_details": None},
            "prompt_logprobs": prompt_logprobs,
            "prompt_token_ids": prompt_token_ids,
            "prompt_text": None,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }
    )


__all__ = ["ChatChoice", "ChatSseEncoder", "chat_body"]
