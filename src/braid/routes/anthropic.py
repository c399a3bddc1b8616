"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens``: Anthropic's Messages API, as
vLLM 0.32 serves it, on chat's data path.

The same steps as :func:`braid.routes.chat.chat_completions`, in the same order (admit, validate,
render, plan, run, merge): the body is validated and translated into a chat request by
:mod:`braid.wire.anthropic`, rendered by the model's chat template, parsed for tool calls and
reasoning by the server's parsers, admitted, aborted on disconnect and bounded by the deadline
exactly as a chat request is; only the shapes differ (:class:`~braid.wire.anthropic_response.
AnthropicEvents`). Every error on these routes is answered in Anthropic's shape
(``{"type": "error", "error": {"type", "message"}}``), the 401 of a missing key too
(:mod:`braid.http.auth`).

``count_tokens`` renders and tokenizes the conversation as ``/v1/messages`` would (tools
included) and answers ``{"input_tokens", "context_management": {"original_input_tokens"}}``; like
``/tokenize`` it takes no engine slot.
"""

from __future__ import annotations

import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import attrs
import msgspec
import trio

from braid.engine.base import Tokenizer, select_model
from braid.errors import (
    BraidError,
    EngineError,
    EngineUnavailable,
    InvalidRequest,
    TooManyRequests,
    Unauthorized,
)
from braid.routes.chat import chat_prompts, choice_parsing, engine_reasoning, parsed_body
from braid.routes.common import (
    AppState,
    JsonResponse,
    Route,
    ViewResult,
    admit,
    collect,
    error_headers,
    open_run,
    plan_request,
    require_json,
    stream,
)
from braid.stream.merge import ResponseCollector, StreamMerger
from braid.stream.parse import ChoiceParsing
from braid.stream.plan import Plan
from braid.stream.render import ChoiceRenderer
from braid.stream.tokenize import INLINE_CHARS, render_conversations
from braid.wire import messages as chat_messages
from braid.wire.anthropic import CountTokensBody, MessagesBody, parse_messages_body
from braid.wire.anthropic_response import COUNT_TOKENS_PATH, MESSAGES_PATH, AnthropicEvents, error_body
from braid.wire.chat_request import ChatRequest
from braid.wire.completions_request import build_request
from braid.wire.messages import TemplateOptions, render
from braid.wire.openapi import REQUEST_ERRORS, REQUEST_ID, Operation, Outcome, error_outcomes, json_body, ref
from braid.wire.output import encode


@attrs.frozen
class TemplateTraits:
    """What the model's chat template does with two inputs of Anthropic's clients, probed once
    per tokenizer as vLLM probes it."""

    merge_inline_system: bool
    """The template refuses a system message after the first turn (Qwen's ``loop.first`` guard):
    system messages inside ``messages`` join the leading one."""
    disabled_effort: str
    """The ``reasoning_effort`` of ``thinking: disabled``: ``"none"``, or ``"low"`` when the
    template fails on ``"none"`` or renders it as it renders a real effort (it ignores it)."""


_TRAITS: weakref.WeakKeyDictionary[Tokenizer, TemplateTraits] = weakref.WeakKeyDictionary()


def _renders(tokenizer: Tokenizer, roles: tuple[str, ...], **kwargs: Any) -> str | None:
    conversation = tuple(chat_messages.Message(role=r, content="t") for r in roles)
    try:
        return render(tokenizer, conversation, TemplateOptions(add_generation_prompt=False, kwargs=kwargs))
    except InvalidRequest:
        return None


def template_traits(tokenizer: Tokenizer) -> TemplateTraits:
    """The tokenizer's :class:`TemplateTraits` (computed on first use, then kept with it)."""
    traits = _TRAITS.get(tokenizer)
    if traits is None:
        merge = _renders(tokenizer, ("system", "user", "system", "user")) is None
        none = _renders(tokenizer, ("user",), reasoning_effort="none", enable_thinking=False)
        efforts = ("low", "medium", "high", "xhigh", "max")
        # as chat sets them (braid.wire.chat_request): enable_thinking follows the effort
        ignored = none is None or any(
            _renders(tokenizer, ("user",), reasoning_effort=e, enable_thinking=True) == none for e in efforts
        )
        traits = TemplateTraits(merge_inline_system=merge, disabled_effort="low" if ignored else "none")
        try:
            _TRAITS[tokenizer] = traits
        except TypeError:  # a tokenizer that takes no weak reference: probed on each request
            pass
    return traits


def _error(err: BraidError) -> JsonResponse:
    return JsonResponse(err.status, encode(error_body(err)), error_headers(err))


def _chat(state: AppState, body: bytes, *, count_tokens: bool) -> ChatRequest:
    traits = template_traits(state.engine.tokenizer)
    return parse_messages_body(
        body,
        state.limits,
        max_model_len=state.engine.info.max_model_len,
        trust_template=state.settings.trust_request_chat_template,
        parsers=state.settings.parsers,
        merge_inline_system=traits.merge_inline_system,
        disabled_effort=traits.disabled_effort,
        count_tokens=count_tokens,
    )


async def messages(
    state: AppState,
    read_body: Callable[[], Awaitable[bytes]],
    *,
    content_type: str | None,
    request_id: str | None,
    background: bool = False,
) -> ViewResult:
    """Answer one ``POST /v1/messages``: the whole ``message``, or its event stream; errors in
    Anthropic's shape. Admission, the deadline, cancellation and the abort of the engine request
    on disconnect are chat's (:func:`braid.routes.chat.chat_completions`)."""
    try:
        ticket, arrived, deadline = admit(state, content_type, request_id, background)
        try:
            chat = _chat(state, await read_body(), count_tokens=False)
            prompts = await chat_prompts(state, chat, deadline)
            parsers, body, structured = parsed_body(state, chat)
            req = build_request(body, prompts, state.limits, structured, max_tokens_param="max_tokens")
            plan = await plan_request(state, req, request_id, deadline, "chatcmpl")
            parsing = None
            if parsers is not None:
                if state.settings.parsers.reasoning_parser is not None:
                    plan = engine_reasoning(plan, parsers)
                parsing = choice_parsing(state, chat, plan, parsers)
        except BaseException:
            ticket.close()
            raise
        run = open_run(state, plan, ticket, arrived, deadline, None if parsing is None else parsing.observer)
        renderer, events = _parts(plan, state.engine.tokenizer, parsing)
        if plan.stream:
            return stream(run, StreamMerger(plan, renderer, events, done=b""))
        return await collect(run, request_id, ResponseCollector(plan, renderer, events))
    except BraidError as err:
        return _error(err)


def _parts(plan: Plan, tokenizer: Tokenizer, parsing: ChoiceParsing | None) -> tuple[ChoiceRenderer, AnthropicEvents]:
    renderer = ChoiceRenderer(plan, tokenizer, chat_top=0, parsing=parsing)
    return renderer, AnthropicEvents(plan.meta, len(plan.items[0].request.prompt_token_ids))


class ContextManagement(msgspec.Struct):
    original_input_tokens: int


class CountTokens(msgspec.Struct):
    """The answer of ``POST /v1/messages/count_tokens``."""

    input_tokens: int
    context_management: ContextManagement


async def count_tokens(
    state: AppState,
    read_body: Callable[[], Awaitable[bytes]],
    *,
    content_type: str | None,
    request_id: str | None = None,
    background: bool = False,  # counting takes no engine slot: no class
) -> JsonResponse:
    """Answer one ``POST /v1/messages/count_tokens``: the prompt's tokens as ``/v1/messages``
    would render them (no engine request, no admission), or the error in Anthropic's shape."""
    try:
        require_json(content_type)
        chat = _chat(state, await read_body(), count_tokens=True)
        select_model(state.engine.info, chat.model)
        tokenizer = state.engine.tokenizer
        (text,) = await render_conversations(chat, tokenizer, state.tokenize_limiter)
        special = chat.body.add_special_tokens
        if len(text) <= INLINE_CHARS:
            ids = tokenizer.encode(text, add_special_tokens=special)
        else:
            (ids,) = await trio.to_thread.run_sync(
                lambda: tokenizer.encode_many([text], add_special_tokens=special), limiter=state.tokenize_limiter
            )
            await trio.lowlevel.checkpoint_if_cancelled()
        answer = CountTokens(len(ids), ContextManagement(len(ids)))
        return JsonResponse(200, msgspec.json.encode(answer))
    except BraidError as err:
        return _error(err)


class ErrorDetail(msgspec.Struct):
    type: str
    """braid's (vLLM's) name for the class of error, e.g. ``BadRequestError``."""
    message: str


class Error(msgspec.Struct):
    """Every error of these routes, as a JSON body and as a stream's ``error`` event."""

    type: Literal["error"]
    error: ErrorDetail


class MessageOut(msgspec.Struct):
    """A whole answer of ``POST /v1/messages``."""

    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    content: list[dict[str, Any]]
    model: str
    usage: dict[str, int]
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"] | None = None
    stop_sequence: str | None = None
    kv_transfer_params: dict[str, Any] | None = None


def _errors(*classes: type[BraidError]) -> tuple[Outcome, ...]:
    """:func:`braid.wire.openapi.error_outcomes` in Anthropic's shape."""
    return tuple(
        attrs.evolve(o, content={"application/json": {"schema": ref(Error)}}) for o in error_outcomes(*classes)
    )


_EVENT = {
    "type": "object",
    "required": ["event", "data"],
    "properties": {"event": {"type": "string"}, "data": {"type": "string", "contentMediaType": "application/json"}},
}
_UNAUTHORIZED = _errors(Unauthorized)[0]
_EXAMPLE = {"model": "braid-tiny", "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}]}

ROUTES = (
    Route(
        MESSAGES_PATH,
        messages,
        Operation(
            "post",
            MESSAGES_PATH,
            "Create a message (Anthropic's Messages API), as vLLM serves it; errors in Anthropic's shape",
            (
                Outcome(
                    200,
                    "The message; with `stream`, Anthropic's events, from `message_start` to `message_stop`.",
                    {"application/json": {"schema": ref(MessageOut)}, "text/event-stream": {"itemSchema": _EVENT}},
                    ("X-Request-Id",),
                ),
                *_errors(*REQUEST_ERRORS, TooManyRequests, EngineError, EngineUnavailable),
            ),
            request=json_body(ref(MessagesBody), {"example": _EXAMPLE}),
            parameters=(REQUEST_ID,),
            structs=(MessagesBody, MessageOut, Error),
            unauthorized=_UNAUTHORIZED,
            required=((MessagesBody, "max_tokens"),),
        ),
    ),
    Route(
        COUNT_TOKENS_PATH,
        count_tokens,
        Operation(
            "post",
            COUNT_TOKENS_PATH,
            "Count a conversation's input tokens as /v1/messages renders it (vLLM's route)",
            (
                Outcome(200, "The token count.", {"application/json": {"schema": ref(CountTokens)}}),
                *_errors(*REQUEST_ERRORS),
            ),
            request=json_body(
                ref(CountTokensBody), {"example": {k: v for k, v in _EXAMPLE.items() if k != "max_tokens"}}
            ),
            structs=(CountTokensBody, CountTokens, Error),
            unauthorized=_UNAUTHORIZED,
        ),
    ),
)


__all__ = ["ROUTES", "count_tokens", "messages", "template_traits"]
