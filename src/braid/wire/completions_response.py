"""Completions' output: ``text_completion`` chunks and body, vLLM 0.32's shapes. Pure.

:class:`CompletionEvents` is the :class:`~braid.wire.output.ChoiceEvents` of ``/v1/completions``.
Per-event work is kept small: the constant head of every chunk is encoded once per response, and
each event costs one msgspec encode of its choice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

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


def logprobs_dict(lp: LogprobsFragment | ChatLogprobs | None) -> dict[str, object] | None:
    if lp is None:
        return None
    assert isinstance(lp, LogprobsFragment), "completions render the legacy logprobs"
    return {
        "text_offset": lp.text_offset,
        "token_logprobs": lp.token_logprobs,
        "tokens": lp.tokens,
        "top_logprobs": lp.top_logprobs,
    }


def _join_logprobs(fragments: Sequence[LogprobsFragment | ChatLogprobs]) -> dict[str, object]:
    parts = [f for f in fragments if isinstance(f, LogprobsFragment)]
    assert len(parts) == len(fragments), "completions render the legacy logprobs"
    return {
        "text_offset": [x for f in parts for x in f.text_offset],
        "token_logprobs": [x for f in parts for x in f.token_logprobs],
        "tokens": [x for f in parts for x in f.tokens],
        "top_logprobs": [x for f in parts for x in f.top_logprobs],
    }


@attrs.define
class CompletionEvents:
    """``/v1/completions``' events and body for one response.

    ``logprobs`` says the request asked for logprobs (a choice with no token then still has an
    empty logprobs object in the body); ``return_token_ids`` that the body lists each choice's ids.
    """

    meta: ResponseMeta
    logprobs: bool = False
    return_token_ids: bool = False
    _head: bytes = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._head = sse_head(self.meta, "text_completion")

    def opening(self) -> bytes:
        return b""

    def chunk(self, c: ChoiceChunk, usage: Usage | None) -> bytes:
        tail = b"]}\n\n" if usage is None else b'],"usage":' + encode(usage.as_dict()) + b"}\n\n"
        choice = {
            "index": c.index,
            "text": c.text,
            "logprobs": logprobs_dict(c.logprobs),
            "finish_reason": c.finish_reason,
            "stop_reason": c.stop_reason,
            "prompt_token_ids": c.prompt_token_ids,
            "token_ids": c.token_ids,
        }
        return self._head + encode(choice) + tail

    def usage(self, usage: Usage) -> bytes:
        return usage_event(self._head, usage)

    def error(self, err: BraidError) -> bytes:
        return error_event(err)

    def body(
        self, choices: Sequence[CollectedChoice], usage: Usage, kv_transfer_params: Mapping[str, Any] | None = None
    ) -> bytes:
        out = []
        for index, ch in enumerate(choices):
            assert ch.first is not None, "a body is built only when every choice has finished"
            logprobs = _join_logprobs(ch.logprobs) if ch.logprobs or self.logprobs else None
            out.append(
                {
                    "index": index,
                    "text": ch.text,
                    "logprobs": logprobs,
                    "finish_reason": ch.finish_reason,
                    "stop_reason": ch.stop_reason,
                    "token_ids": ch.token_ids if self.return_token_ids else None,
                    "prompt_logprobs": ch.first.prompt_logprobs,
                    "prompt_token_ids": ch.first.prompt_token_ids,
                    "routed_experts": None,
                }
            )
        meta = self.meta
        return encode(
            {
                "id": meta.id,
                "object": "text_completion",
                "created": meta.created,
                "model": meta.model,
                "choices": out,
                "service_tier": None,
                "system_fingerprint": None,
                "usage": usage.body(),
                "kv_transfer_params": kv_transfer_params,
                "ec_transfer_params": None,
                "metrics": None,
            }
        )


__all__ = ["CompletionEvents", "logprobs_dict"]
