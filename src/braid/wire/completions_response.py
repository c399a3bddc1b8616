"""Encode: choice chunks and usage -> response bytes (SSE events or one JSON body).

Pure. Per-event work is kept small: the constant part of every stream chunk is encoded once per
request, and each event costs one msgspec encode of the choice.
"""

from __future__ import annotations

import json

import attrs
import msgspec

from braid.errors import BraidError
from braid.stream.plan import ResponseMeta
from braid.stream.render import ChoiceChunk, LogprobsFragment

DONE = b"data: [DONE]\n\n"
HEARTBEAT = b": ping\n\n"

_encode = msgspec.json.Encoder().encode


@attrs.frozen
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None = None
    """``prompt_tokens_details.cached_tokens``; None: not reported (the server's default)."""

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def as_dict(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.total_tokens,
            "completion_tokens": self.completion_tokens,
        }


def logprobs_dict(lp: LogprobsFragment | None) -> dict[str, object] | None:
    if lp is None:
        return None
    return {
        "text_offset": lp.text_offset,
        "token_logprobs": lp.token_logprobs,
        "tokens": lp.tokens,
        "top_logprobs": lp.top_logprobs,
    }


def _stream_choice(c: ChoiceChunk) -> dict[str, object]:
    return {
        "index": c.index,
        "text": c.text,
        "logprobs": logprobs_dict(c.logprobs),
        "finish_reason": c.finish_reason,
        "stop_reason": c.stop_reason,
        "prompt_token_ids": c.prompt_token_ids,
        "token_ids": c.token_ids,
    }


@attrs.define
class SseEncoder:
    """SSE framing for one request: ``data: {json}\\n\\n`` events, vLLM's chunk shape."""

    meta: ResponseMeta
    _head: bytes = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        head = _encode(
            {"id": self.meta.id, "object": "text_completion", "created": self.meta.created, "model": self.meta.model}
        )
        self._head = b"data: " + head[:-1] + b',"choices":['

    def chunk(self, c: ChoiceChunk, usage: Usage | None = None) -> bytes:
        tail = b"]}\n\n" if usage is None else b'],"usage":' + _encode(usage.as_dict()) + b"}\n\n"
        return self._head + _encode(_stream_choice(c)) + tail

    def usage(self, usage: Usage) -> bytes:
        body = usage.as_dict()
        if usage.cached_tokens is not None:  # vLLM's final usage chunk drops the details' nulls
            body["prompt_tokens_details"] = {"cached_tokens": usage.cached_tokens}  # type: ignore[assignment]
        return self._head + b'],"usage":' + _encode(body) + b"}\n\n"

    @staticmethod
    def error(err: BraidError) -> bytes:
        # vLLM writes error events with json.dumps (spaced, ASCII-escaped), unlike chunks.
        return b"data: " + json.dumps(err.body()).encode() + b"\n\n"


def _prompt_details(usage: Usage) -> dict[str, int | None] | None:
    if usage.cached_tokens is None:
        return None
    return {"cached_tokens": usage.cached_tokens, "created_cache_tokens": None, "multimodal_tokens": None}


def completion_body(meta: ResponseMeta, choices: list[dict[str, object]], usage: Usage) -> bytes:
    return _encode(
        {
            "id": meta.id,
            "object": "text_completion",
            "created": meta.created,
            "model": meta.model,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": None,
            "usage": {
                **usage.as_dict(),
                "prompt_tokens_details": _prompt_details(usage),
                "completion_tokens_details": None,
            },
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }
    )


def error_body(err: BraidError) -> bytes:
    return _encode(err.body())
