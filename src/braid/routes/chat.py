"""``POST /v1/chat/completions`` and its batch route: their views, output and OpenAPI entries.

The same data path as :mod:`braid.routes.completions` (the same admission, plan, run, merger and
errors); only the prompts differ (rendered from the messages by the model's chat template:
:mod:`braid.wire.chat_request`, :func:`braid.stream.tokenize.render_conversations`), and the
shapes (:class:`braid.wire.chat_response.ChatEvents`: a role chunk per choice first, chat's
logprobs).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import attrs
import msgspec
import trio

from braid.engine.base import Tokenizer
from braid.engine.constraint import Structured
from braid.errors import BraidError
from braid.routes.common import (
    AppState,
    Prepared,
    Route,
    View,
    ViewResult,
    admit,
    check_deadline,
    collect,
    error_response,
    open_run,
    plan_request,
    stream,
)
from braid.stream.merge import ResponseCollector, StreamMerger
from braid.stream.parse import ChoiceParsing, ParsingOptions
from braid.stream.plan import Plan
from braid.stream.render import ChoiceRenderer
from braid.stream.tokenize import render_conversations
from braid.wire import shapes
from braid.wire.chat_request import ChatBody, ChatRequest, parse_chat
from braid.wire.chat_response import ChatEvents, ChatPrompts, ChatShape
from braid.wire.completions_request import CompletionBody, Prompt, TextPrompt, TokenPrompt, build_request
from braid.wire.messages import echo_text, response_role
from braid.wire.openapi import GENERATION_ERRORS, REQUEST_ID, Operation, generation_ok, json_body, ref

if TYPE_CHECKING:
    from braid.engine.vllm_parsers import RequestParsers  # imports vLLM: loaded only with parser flags


async def chat_completions(
    state: AppState,
    read_body: Callable[[], Awaitable[bytes]],
    *,
    content_type: str | None,
    request_id: str | None,
    background: bool = False,
    batch: bool = False,
) -> ViewResult:
    """Answer one chat request (``batch``: the batch route, a list of conversations), as
    :func:`braid.routes.completions.completions` answers its requests: the same admission, plan,
    run, errors and cancellation."""
    try:
        ticket, arrived, deadline = admit(state, content_type, request_id, background)
        try:
            prepared = await prepare(state, await read_body(), request_id, deadline, batch=batch)
        except BaseException:
            ticket.close()
            raise
        run = open_run(state, prepared.plan, ticket, arrived, deadline, prepared.observe)
        if prepared.plan.stream:
            return stream(run, prepared.merger())
        return await collect(run, request_id, prepared.collector())
    except BraidError as err:
        return error_response(err)


async def prepare(
    state: AppState, body: bytes, request_id: str | None, deadline: float, *, batch: bool = False
) -> Prepared:
    """Validate (:func:`~braid.wire.chat_request.parse_chat`), render, tokenize and plan one body:
    the view's steps between admission and the run (:class:`~braid.routes.common.Prepare`)."""
    chat = parse_chat(
        body,
        state.limits,
        max_model_len=state.engine.info.max_model_len,
        batch=batch,
        trust_template=state.settings.trust_request_chat_template,
        parsers=state.settings.parsers,
    )
    prompts = await chat_prompts(state, chat, deadline)
    parsers, sampling, structured = parsed_body(state, chat)
    req = build_request(sampling, prompts, state.limits, structured, max_tokens_param="max_completion_tokens")
    plan = await plan_request(state, req, request_id, deadline, "chatcmpl")
    if parsers is not None and state.settings.parsers.reasoning_parser is not None:
        plan = engine_reasoning(plan, parsers)
    parsing = None if parsers is None else choice_parsing(state, chat, plan, parsers)
    renderer, events = _parts(plan, state.engine.tokenizer, chat_shape(chat), parsing)
    return Prepared(plan, renderer, events, None if parsing is None else parsing.observer)


async def chat_prompts(state: AppState, chat: ChatRequest, deadline: float) -> tuple[Prompt, ...]:
    """The engine prompts of a validated chat request (every dialect on chat's path): a prefill
    stage's ids as they are (``kv_transfer_params``), else its conversations rendered by the
    template, a DeadlineExceeded if that outlasts ``deadline``."""
    if chat.reused_prompt is not None:
        return (TokenPrompt(chat.reused_prompt),)
    with trio.move_on_at(deadline):
        texts = await render_conversations(chat, state.engine.tokenizer, state.tokenize_limiter)
    check_deadline(deadline, state.settings.request_timeout)
    return tuple(TextPrompt(t) for t in texts)


def parsed_body(state: AppState, chat: ChatRequest) -> tuple[RequestParsers | None, CompletionBody, Structured | None]:
    """The request's parsers (None: none runs) and the sampling body and constraint they leave
    (:func:`constrain`)."""
    parsers = request_parsers(state, chat)
    if parsers is None:
        return None, chat.body, chat.structured
    body, structured = constrain(parsers, chat)
    return parsers, body, structured


def chat_shape(chat: ChatRequest) -> ChatShape:
    """What the response adds to the plan: each conversation's reply role and echoed text."""
    roles = tuple(response_role(c, chat.template) for c in chat.conversations)
    return ChatShape(
        roles=roles,
        echo=tuple(echo_text(c, r) if chat.echo else "" for c, r in zip(chat.conversations, roles, strict=True)),
        top_logprobs=chat.top_logprobs if chat.logprobs else None,
    )


def request_parsers(state: AppState, chat: ChatRequest) -> RequestParsers | None:
    """The request's parsers: when it may call tools (``tool_choice`` other than ``"none"``) or
    the server has a reasoning parser; None otherwise, and then nothing of the parsers runs."""
    parsers = state.parsers
    if parsers is None or not (chat.tool_choice.parses or state.settings.parsers.reasoning_parser):
        return None
    return parsers.for_request(
        tools=chat.tools,
        tool_choice=chat.tool_choice.raw,
        parallel_tool_calls=chat.tool_choice.parallel,
        chat_template_kwargs=chat.chat_template_kwargs,
        include_reasoning=chat.include_reasoning,
    )


def constrain(parsers: RequestParsers, chat: ChatRequest) -> tuple[CompletionBody, Structured | None]:
    """The sampling body and constraint as the request's parser adjusts them (vLLM's
    ``adjust_request``): a forced call (``"required"``, a named function) becomes the parser's
    constraint, which replaces the request's own (a named function and a constraint were
    refused together already); under ``"auto"`` the request's own constraint, if any, stays.
    A format whose markers are special tokens keeps them in the text."""
    adjustment = parsers.constraint()
    structured = chat.structured
    if adjustment.structured is not None and (structured is None or chat.tool_choice.mode != "auto"):
        structured = adjustment.structured
    body = chat.body
    if not adjustment.skip_special_tokens and body.skip_special_tokens:
        body = msgspec.structs.replace(body, skip_special_tokens=False)
    return body, structured


def engine_reasoning(plan: Plan, parsers: RequestParsers) -> Plan:
    """The plan's engine requests told what vLLM's serving layer tells them through a reasoning
    parser: whether each prompt already ended the reasoning (a grammar then applies from the
    first token; otherwise the engine waits for the reasoning's end), and the request's template
    kwargs for the engine's reasoning parser."""
    items = []
    for item in plan.items:
        ended, kwargs = parsers.engine_reasoning(item.request.prompt_token_ids)
        request = attrs.evolve(item.request, reasoning_ended=ended, reasoning_parser_kwargs=kwargs)
        items.append(attrs.evolve(item, request=request))
    return attrs.evolve(plan, items=tuple(items))


def choice_parsing(state: AppState, chat: ChatRequest, plan: Plan, parsers: RequestParsers) -> ChoiceParsing:
    options = ParsingOptions(
        chat.tool_choice,
        include_reasoning=chat.include_reasoning,
        count_reasoning=state.settings.parsers.reasoning_parser is not None,
    )
    return ChoiceParsing.create(
        options,
        [item.request.prompt_token_ids for item in plan.items],
        plan.n,
        plan.stream,
        parsers.choice,
    )


def _parts(
    plan: Plan, tokenizer: Tokenizer, shape: ChatShape, parsing: ChoiceParsing | None
) -> tuple[ChoiceRenderer, ChatEvents]:
    if parsing is not None:
        shape = attrs.evolve(
            shape,
            hide_token_data=not parsing.options.include_reasoning,
            counts_reasoning=parsing.options.count_reasoning,
        )
    renderer = ChoiceRenderer(
        plan, tokenizer, chat_top=0 if shape.top_logprobs is None else shape.top_logprobs, parsing=parsing
    )
    prompts = ChatPrompts(
        token_ids=tuple(item.request.prompt_token_ids for item in plan.items),
        n=plan.n,
        return_token_ids=plan.return_token_ids,
        continuous_usage=plan.continuous_usage,
    )
    return renderer, ChatEvents(plan.meta, shape, prompts)


def merger(plan: Plan, tokenizer: Tokenizer, shape: ChatShape, parsing: ChoiceParsing | None = None) -> StreamMerger:
    """The stream of a chat plan: role (and echo) chunks first, then ``chat.completion.chunk`` s."""
    return StreamMerger(plan, *_parts(plan, tokenizer, shape, parsing))


def collector(
    plan: Plan, tokenizer: Tokenizer, shape: ChatShape, parsing: ChoiceParsing | None = None
) -> ResponseCollector:
    """The whole ``chat.completion`` body of a chat plan."""
    return ResponseCollector(plan, *_parts(plan, tokenizer, shape, parsing))


def _operation(path: str, summary: str, example: object) -> Operation:
    return Operation(
        "post",
        path,
        summary,
        (generation_ok("The chat completion", shapes.ChatCompletion, shapes.ChatChunk), *GENERATION_ERRORS),
        request=json_body(ref(ChatBody), {"example": example}),
        parameters=(REQUEST_ID,),
        structs=(ChatBody, shapes.ChatCompletion, shapes.ChatChunk),
        # As completions' ``prompt``: defaulted for the decoder, required of a client.
        required=((ChatBody, "messages"),),
    )


chat_completions_batch: View = functools.partial(chat_completions, batch=True)

ROUTES = (
    Route(
        "/v1/chat/completions",
        chat_completions,
        _operation(
            "/v1/chat/completions",
            "Create a chat completion (one conversation in `messages`), as vLLM serves it",
            {"messages": [{"role": "user", "content": "Say this is a test"}], "max_tokens": 16},
        ),
        reports_load=True,  # as vLLM's single route; its batch route sends no report
    ),
    Route(
        "/v1/chat/completions/batch",
        chat_completions_batch,
        _operation(
            "/v1/chat/completions/batch",
            "Chat completions for a list of conversations (`messages`: a list of message lists); "
            "braid also streams them and takes `n` > 1",
            {"messages": [[{"role": "user", "content": "Hi"}], [{"role": "user", "content": "Bye"}]]},
        ),
    ),
)


__all__ = ["ROUTES", "chat_completions", "chat_completions_batch", "chat_shape", "collector", "merger", "prepare"]
