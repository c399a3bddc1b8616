"""The ``/tokenize`` and ``/detokenize`` views, without quart: vLLM 0.32's two utility routes.

``POST /tokenize`` answers ``{count, max_model_len, tokens, token_strs}`` (``token_strs`` null
unless asked for), ``POST /detokenize`` answers ``{prompt}``; what they take and refuse is
:mod:`braid.wire.tokenize_request`. Neither is an engine request: no admission ticket, and they are
answered while the server drains or after the engine has died (the tokenizer is braid's own).

Like a completions prompt (:mod:`braid.stream.tokenize`), a large body is worked on braid's tokenizing
thread, not the Trio thread: over :data:`~braid.stream.tokenize.INLINE_CHARS` bytes of body, the
rendering, encoding (``encode_many``) and spelling of a ``/tokenize``, and the decoding of a
``/detokenize``, run there, one request at a time (``AppState.tokenize_limiter``). Inline, a
long text or a few hundred thousand ids would stall every stream of the server for the time
they take. The request's ``--request-timeout`` bounds the whole (408 past it); cancellation
waits for the thread, as in :mod:`braid.stream.tokenize`.

Both take the :class:`~braid.routes.common.View` arguments; ``request_id`` goes unused (no engine
request is named by it; the app still echoes the header). Every
:class:`~braid.errors.BraidError` is answered as its JSON error, as the completions view
answers its own; anything else is a bug, raised as it is (the app answers it with a 500).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import TypeVar

import msgspec
import trio

from braid.engine.base import Tokenizer, served_names
from braid.errors import BraidError, DeadlineExceeded
from braid.routes.common import AppState, JsonResponse, Route, error_response, require_json
from braid.stream.tokenize import INLINE_CHARS
from braid.wire import shapes as responses
from braid.wire.messages import render
from braid.wire.openapi import REQUEST_ERRORS, Operation, Outcome, error_outcomes, json_body, ref
from braid.wire.tokenize_request import (
    Detokenize,
    DetokenizeBody,
    TokenizeChat,
    TokenizeChatBody,
    TokenizePromptBody,
    TokenizeText,
    parse_detokenize,
    parse_tokenize,
)

T = TypeVar("T")


async def tokenize(
    state: AppState,
    read_body: Callable[[], Awaitable[bytes]],
    *,
    content_type: str | None,
    request_id: str | None = None,
    background: bool = False,  # tokenizing takes no engine slot: no class
    inline_chars: int = INLINE_CHARS,
) -> JsonResponse:
    """Answer one ``POST /tokenize``: 200 with the tokens, or the JSON error (400, 404, 408,
    413). ``read_body()`` is called after the content type is checked."""
    try:
        deadline = _deadline(state)
        require_json(content_type)
        body = await read_body()
        info = state.engine.info
        req = parse_tokenize(body, model=served_names(info), trust_template=state.settings.trust_request_chat_template)
        tokenizer = state.engine.tokenizer
        large = len(body) > inline_chars

        def work() -> tuple[list[int], list[str] | None]:
            return _tokens(tokenizer, req, on_thread=large)

        ids, strs = await _run(state, deadline, work, on_thread=large)
        answer = responses.Tokenize(count=len(ids), max_model_len=info.max_model_len, tokens=ids, token_strs=strs)
        return JsonResponse(200, msgspec.json.encode(answer))
    except BraidError as err:
        return error_response(err)


async def detokenize(
    state: AppState,
    read_body: Callable[[], Awaitable[bytes]],
    *,
    content_type: str | None,
    request_id: str | None = None,
    background: bool = False,  # tokenizing takes no engine slot: no class
    inline_chars: int = INLINE_CHARS,
) -> JsonResponse:
    """Answer one ``POST /detokenize``: 200 with the text (special tokens spelled out, as vLLM
    decodes them), or the JSON error (400, 404, 408, 413)."""
    try:
        deadline = _deadline(state)
        require_json(content_type)
        body = await read_body()
        info = state.engine.info
        req = parse_detokenize(
            body, model=served_names(info), vocab_size=info.vocab_size, max_model_len=info.max_model_len
        )
        tokenizer = state.engine.tokenizer

        def work() -> str:
            return _text(tokenizer, req)

        text = await _run(state, deadline, work, on_thread=len(body) > inline_chars)
        return JsonResponse(200, msgspec.json.encode(responses.Detokenize(prompt=text)))
    except BraidError as err:
        return error_response(err)


def _tokens(
    tokenizer: Tokenizer, req: TokenizeText | TokenizeChat, *, on_thread: bool
) -> tuple[list[int], list[str] | None]:
    """The request's token ids (and their spellings, when asked for). ``on_thread``: called on
    the tokenizing thread, where only ``encode_many`` may encode."""
    text = req.text if isinstance(req, TokenizeText) else render(tokenizer, req.messages, req.template)
    special = req.add_special_tokens
    if on_thread:
        (ids,) = tokenizer.encode_many([text], add_special_tokens=special)
    else:
        ids = tokenizer.encode(text, add_special_tokens=special)
    return ids, tokenizer.token_strs(ids) if req.return_token_strs else None


def _text(tokenizer: Tokenizer, req: Detokenize) -> str:
    return tokenizer.decode(req.tokens, skip_special_tokens=False)


def _deadline(state: AppState) -> float:
    timeout = state.settings.request_timeout
    return trio.current_time() + timeout if timeout is not None else math.inf


async def _run(state: AppState, deadline: float, work: Callable[[], T], *, on_thread: bool) -> T:
    """``work()`` inline, or on the tokenizing thread; a 408 if the deadline passed meanwhile."""
    if not on_thread:
        return work()
    with trio.move_on_at(deadline):
        result = await trio.to_thread.run_sync(work, limiter=state.tokenize_limiter)
        # to_thread returns the result even when cancelled meanwhile: raise the cancellation here
        await trio.lowlevel.checkpoint_if_cancelled()
        return result
    raise DeadlineExceeded(f"The request did not finish within its {state.settings.request_timeout:g} s timeout.")


_ERRORS = error_outcomes(*REQUEST_ERRORS)
"""No admission and no engine request: no 429, no 500, no 503."""

ROUTES = (
    Route(
        "/tokenize",
        tokenize,
        Operation(
            "post",
            "/tokenize",
            "Token ids of a text, or of a conversation as the chat template renders it (vLLM's route)",
            (Outcome(200, "The token ids.", {"application/json": {"schema": ref(responses.Tokenize)}}), *_ERRORS),
            request=json_body(
                {"anyOf": [ref(TokenizePromptBody), ref(TokenizeChatBody)]},
                {
                    "text": {"prompt": "Hello world", "return_token_strs": True},
                    "chat": {"messages": [{"role": "user", "content": "Hi"}]},
                },
            ),
            structs=(TokenizePromptBody, TokenizeChatBody, responses.Tokenize),
        ),
    ),
    Route(
        "/detokenize",
        detokenize,
        Operation(
            "post",
            "/detokenize",
            "The text of token ids (vLLM's route)",
            (Outcome(200, "The text.", {"application/json": {"schema": ref(responses.Detokenize)}}), *_ERRORS),
            request=json_body(ref(DetokenizeBody), {"example": {"tokens": [0, 75, 108, 111]}}),
            structs=(DetokenizeBody, responses.Detokenize),
        ),
    ),
)


__all__ = ["ROUTES", "detokenize", "tokenize"]
