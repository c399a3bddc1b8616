"""Validate a chat body: ``/v1/chat/completions`` (one conversation) and its batch route.

A chat request is a completions request whose prompts are rendered from messages. So the body is
decoded by msgspec in strict mode into :class:`ChatBody`, the chat-only rules are checked here
(messages, template flags, ``logprobs``/``top_logprobs``, tools), and its sampling fields are
carried over into a :class:`~braid.wire.completions_request.CompletionBody` that the shared checks
(:func:`braid.wire.fields.check_fields`) and :func:`~braid.wire.completions_request.build_request`
take as they are: one set of sampling rules for both routes.
The prompts are rendered later, by the view (:func:`braid.wire.messages.render`), because the template
belongs to the engine's tokenizer.

vLLM's chat differences kept here: ``max_completion_tokens`` wins over ``max_tokens``, and with
neither the reply may fill the context's room (not 16 tokens); ``add_special_tokens`` is false by
default; ``logprobs`` is a boolean and ``top_logprobs`` the count; ``echo`` repeats the last
message's text, not prompt tokens. Tools are refused unless ``tool_choice`` is ``"none"`` (braid
does not parse tool calls), and a request's own ``chat_template`` needs the server's
``--trust-request-chat-template``.
"""

from __future__ import annotations

from typing import Any

import attrs
import msgspec

from braid.errors import InvalidRequest, SchemaError
from braid.wire.completions_request import CompletionBody
from braid.wire.fields import INT64_MAX, INT64_MIN, Limits, SamplingBody, check_fields, decode_body, structured_of
from braid.wire.messages import Message, TemplateOptions, parse_messages, parse_tools
from braid.wire.structured import Structured


class ChatBody(SamplingBody, frozen=True):
    """The body of ``POST /v1/chat/completions`` (``messages``: one conversation) and of its batch
    route (``messages``: a list of conversations): the shared fields and chat's own."""

    messages: Any = None
    max_completion_tokens: int | None = None
    echo: bool = False
    logprobs: bool | None = None
    top_logprobs: int | None = None
    add_special_tokens: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    documents: list[dict[str, str]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None


_DECODER = msgspec.json.Decoder(ChatBody)

# Carried over to the completions body by name (max_tokens: chat's rule, below).
_SHARED = tuple(name for name in SamplingBody.__struct_fields__ if name != "max_tokens")


@attrs.frozen
class ChatRequest:
    """A validated chat request, its prompts not yet rendered."""

    conversations: tuple[tuple[Message, ...], ...]
    template: TemplateOptions
    body: CompletionBody
    """The sampling fields as a completions body (``prompt`` unset): :func:`braid.wire.completions_request.build_request`
    turns it and the rendered prompts into the engine's request."""
    structured: Structured | None
    """``response_format`` / ``structured_outputs`` (:mod:`braid.wire.structured`)."""
    logprobs: bool
    top_logprobs: int
    """Alternatives listed per token (-1: all the engine returned)."""
    echo: bool
    batch: bool

    @property
    def model(self) -> str | None:
        return self.body.model


def _bad(message: str, param: str | None = None) -> InvalidRequest:
    return InvalidRequest(message, param=param)


def _check_chat(b: ChatBody, *, trust_template: bool, batch: bool) -> None:
    # vLLM's validators, with its params (None where vLLM names none); what its pydantic schema
    # refuses is a SchemaError at pydantic's location.
    if b.seed is not None and not INT64_MIN <= b.seed <= INT64_MAX:
        raise SchemaError(f"seed must be a 64-bit integer, got {b.seed}.", param="body.seed")
    if batch and b.tool_choice is not None and b.tool_choice != "none":
        raise SchemaError('The batch route takes no tools: `tool_choice` must be "none".', param="body.tool_choice")
    top = b.top_logprobs
    if top is not None:
        if top < 0 and top != -1:
            raise _bad("`top_logprobs` must be a positive value or -1.", "top_logprobs")
        if (top == -1 or top > 0) and not b.logprobs:
            raise _bad("when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs")
    if b.tools is not None and not b.tools:
        raise _bad("`tools` cannot be an empty list; leave it out instead.", "tools")
    if b.tool_choice is not None and b.tool_choice != "none":
        if b.tools is None:
            raise _bad("When using `tool_choice`, `tools` must be set.", "tool_choice")
        raise _bad('braid does not parse tool calls: `tool_choice` must be "none".')
    if b.tools is not None and b.tool_choice is None:
        raise _bad('braid does not parse tool calls: with `tools`, `tool_choice` must be "none".')
    in_kwargs = (b.chat_template_kwargs or {}).get("chat_template") is not None
    if (b.chat_template is not None or in_kwargs) and not trust_template:
        raise _bad(
            "Chat template is passed with request, but --trust-request-chat-template is not set. "
            "Refused request with untrusted chat template."
        )


def _conversations(messages: object, batch: bool) -> tuple[tuple[Message, ...], ...]:
    try:
        if not batch:
            return (parse_messages(messages),)
        if not isinstance(messages, list) or not messages:
            raise SchemaError("messages must be a non-empty list of conversations.", param="body.messages")
        for i, c in enumerate(messages):
            if c == []:  # pydantic's min_length on each conversation
                raise SchemaError(f"messages[{i}] must hold at least one message.", param=f"body.messages.{i}")
        return tuple(parse_messages(c, f"messages[{i}]") for i, c in enumerate(messages))
    except SchemaError as exc:
        exc.param = _pydantic_location(exc.param)
        raise


def _pydantic_location(param: str | None) -> str | None:
    """A location braid spells ``messages[0].content`` as vLLM's pydantic names it
    (``body.messages.0.content``); :func:`~braid.wire.messages.parse_messages` gives the others
    in pydantic's spelling already."""
    if param is None or not param.startswith("messages"):
        return param
    return "body." + param.replace("[", ".").replace("]", "")


def parse_chat(
    body: bytes, limits: Limits, *, max_model_len: int, batch: bool, trust_template: bool = False
) -> ChatRequest:
    """Decode and validate a chat body, or raise :class:`~braid.errors.InvalidRequest` (a 400).

    ``batch``: the body is for the batch route (``messages`` is a list of conversations).
    """
    b: ChatBody = decode_body(body, _DECODER)
    _check_chat(b, trust_template=trust_template, batch=batch)
    if batch:
        # vLLM's batch route checks the tools (a 400 without a param) but never renders them.
        try:
            parse_tools(b.tools)
        except SchemaError as exc:
            raise InvalidRequest(exc.message) from None
        tools = None
    else:
        tools = parse_tools(b.tools)
    template = TemplateOptions(
        add_generation_prompt=b.add_generation_prompt,
        continue_final_message=b.continue_final_message,
        chat_template=b.chat_template,
        kwargs={**(b.chat_template_kwargs or {}), **({"documents": b.documents} if b.documents else {})},
        tools=tools,
    )
    max_tokens = b.max_completion_tokens if b.max_completion_tokens is not None else b.max_tokens
    top = b.top_logprobs or 0  # -1: every token of the vocabulary, as for completions
    carried = CompletionBody(
        **{name: getattr(b, name) for name in _SHARED},
        # no limit: the context's room (the plan shrinks it to what each prompt leaves)
        max_tokens=max_model_len if max_tokens is None else max_tokens,
        logprobs=top if b.logprobs else None,
        add_special_tokens=b.add_special_tokens,  # chat's default is false
    )
    check_fields(carried, limits, logprobs=carried.logprobs)
    if b.echo and b.prompt_logprobs is None:
        # vLLM's chat: echo reports the prompt's logprobs, at top_logprobs (0: the prompt token
        # alone), even in a stream (which does not show them); after the checks, as vLLM's
        # validators see only the fields the client sent.
        carried = msgspec.structs.replace(carried, prompt_logprobs=top)
    structured = structured_of(carried)
    conversations = _conversations(b.messages, batch)
    if len(conversations) > limits.max_prompts:
        raise _bad(
            f"messages holds {len(conversations)} conversations, more than the maximum of {limits.max_prompts}.",
            "messages",
        )
    return ChatRequest(
        conversations=conversations,
        template=template,
        body=carried,
        structured=structured,
        logprobs=bool(b.logprobs),
        top_logprobs=top,
        echo=b.echo,
        batch=batch,
    )


__all__ = ["ChatBody", "ChatRequest", "parse_chat"]
