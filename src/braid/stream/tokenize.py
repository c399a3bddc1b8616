"""Tokenize: a request's text prompts -> token ids, on a worker thread when there is much text.

Chat conversations are rendered to their prompt texts here too (:func:`render_conversations`),
by the same rule.

Tokenizing runs before the plan (:mod:`braid.stream.plan`), in the request's own task. Inline it blocks
the Trio thread, and with it every other stream of the server: a batch of many long prompts takes
long enough that every running stream visibly stalls (docs/performance-log.md, round 4). So:

* Up to :data:`INLINE_CHARS` characters of prompt text in all, the texts are encoded inline:
  a thread hop would cost more than the encoding (the common case: one short prompt).
* Above that, :meth:`Tokenizer.encode_many` runs on a worker thread, one request's batch at a
  time (``limiter``: the tokenizer's worker copy is not shared between threads). The Hugging
  Face backend releases the GIL while it encodes, so the Trio thread keeps serving.

Cancellation (client gone, drain): the thread cannot be stopped, so the request waits for it
and ``encode_prompts`` raises ``Cancelled`` when it returns: a bounded wait (the encoding time)
with no thread left behind. No engine request exists yet, so nothing is left to abort.
"""

from __future__ import annotations

from collections.abc import Mapping

import trio

from braid.engine.base import Tokenizer
from braid.wire.chat_request import ChatRequest
from braid.wire.completions_request import CompletionRequest, TextPrompt
from braid.wire.messages import render

INLINE_CHARS = 16 * 1024
"""Above this much prompt text (characters, all prompts together) tokenizing leaves the Trio thread."""


def text_prompts(req: CompletionRequest) -> dict[int, str]:
    """The request's text prompts by prompt index (token-id prompts need no tokenizing)."""
    return {i: p.text for i, p in enumerate(req.prompts) if isinstance(p, TextPrompt)}


async def encode_prompts(
    req: CompletionRequest,
    tokenizer: Tokenizer,
    limiter: trio.CapacityLimiter,
    *,
    inline_chars: int = INLINE_CHARS,
) -> Mapping[int, tuple[int, ...]]:
    """Token ids of every text prompt, by prompt index, for :func:`braid.stream.plan.make_plan`."""
    texts = text_prompts(req)
    if not texts:
        return {}
    special = req.add_special_tokens
    if sum(map(len, texts.values())) <= inline_chars:
        return {i: tuple(tokenizer.encode(t, add_special_tokens=special)) for i, t in texts.items()}
    batch = list(texts.values())
    ids = await trio.to_thread.run_sync(
        lambda: tokenizer.encode_many(batch, add_special_tokens=special), limiter=limiter
    )
    # to_thread returns the result even when cancelled meanwhile; raise it here, before a plan
    await trio.lowlevel.checkpoint_if_cancelled()
    return {i: tuple(one) for i, one in zip(texts, ids, strict=True)}


async def render_conversations(
    req: ChatRequest,
    tokenizer: Tokenizer,
    limiter: trio.CapacityLimiter,
    *,
    inline_chars: int = INLINE_CHARS,
) -> tuple[str, ...]:
    """Every conversation rendered by the chat template (:func:`braid.wire.messages.render`), in order:
    inline for little text, on the worker thread for a batch with much (the template is jinja,
    run in Python: as slow per character as tokenizing is fast). Cancellation as for
    :func:`encode_prompts`."""
    size = sum(m.chars for c in req.conversations for m in c)
    if req.template.tools:  # rendered into every conversation
        size += len(req.conversations) * len(repr(req.template.tools))  # about its JSON's size

    def render_all() -> tuple[str, ...]:
        return tuple(render(tokenizer, c, req.template) for c in req.conversations)

    if size <= inline_chars:
        return render_all()
    texts = await trio.to_thread.run_sync(render_all, limiter=limiter)
    await trio.lowlevel.checkpoint_if_cancelled()
    return texts


__all__ = ["INLINE_CHARS", "encode_prompts", "render_conversations", "text_prompts"]
