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
message's text, not prompt tokens. ``tool_choice`` is checked as vLLM checks it (its pydantic
validator, then its server's rules, which need the server's flags: :class:`ToolChoice`), and a
request's own ``chat_template`` needs the server's ``--trust-request-chat-template``. Unlike
vLLM's batch route, braid's takes tools.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs
import msgspec

from braid.errors import InvalidRequest, SchemaError
from braid.settings import ParserOptions
from braid.wire.completions_request import CompletionBody
from braid.wire.fields import Limits, SamplingBody, check_fields, check_seed, decode_body, structured_of
from braid.wire.kv_transfer import reused_prompt
from braid.wire.messages import Message, TemplateOptions, check_template_trusted, parse_messages, parse_tools
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
    include_reasoning: bool = True
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None


_DECODER = msgspec.json.Decoder(ChatBody)

# Carried over to the completions body by name (max_tokens: chat's rule, below).
_SHARED = tuple(name for name in SamplingBody.__struct_fields__ if name != "max_tokens")


ToolMode = Literal["none", "auto", "required", "named"]


@attrs.frozen
class ToolChoice:
    """What a request's ``tool_choice`` asks, with vLLM's default: ``"auto"`` when there are
    tools and no ``tool_choice``, ``"none"`` without tools."""

    mode: ToolMode = "none"
    name: str | None = None
    """The function of a named choice."""
    raw: object = None
    """As the body has it (for vLLM's parsers, which read their own request model)."""
    parallel: bool = True
    """``parallel_tool_calls``: false keeps a choice's first call only."""

    @property
    def parses(self) -> bool:
        """The output is parsed for calls (every mode but ``"none"``)."""
        return self.mode != "none"


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
    tools: tuple[dict[str, Any], ...] | None = None
    """The request's tools as vLLM dumps them (:func:`~braid.wire.messages.parse_tools`)."""
    tool_choice: ToolChoice = ToolChoice()
    include_reasoning: bool = True
    """False: the reasoning is parsed out and dropped (vLLM's field)."""
    chat_template_kwargs: dict[str, Any] = attrs.field(factory=dict)
    """What vLLM hands its parsers (:func:`_parser_kwargs`; some read ``enable_thinking``)."""
    reused_prompt: tuple[int, ...] | None = None
    """``kv_transfer_params.prompt_token_ids``, the prompt in place of the rendered messages
    (:mod:`braid.wire.kv_transfer`); None: render them."""

    @property
    def model(self) -> str | None:
        return self.body.model


def _bad(message: str, param: str | None = None) -> InvalidRequest:
    return InvalidRequest(message, param=param)


def _check_chat(b: ChatBody, *, trust_template: bool) -> None:
    # vLLM's validators, with its params (None where vLLM names none); what its pydantic schema
    # refuses is a SchemaError at pydantic's location.
    check_seed(b.seed)
    top = b.top_logprobs
    if top is not None:
        if top < 0 and top != -1:
            raise _bad("`top_logprobs` must be a positive value or -1.", "top_logprobs")
        if (top == -1 or top > 0) and not b.logprobs:
            raise _bad("when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs")
    check_template_trusted(b.chat_template, b.chat_template_kwargs, trust=trust_template)


def _thinking(b: ChatBody) -> dict[str, Any]:
    """What ``reasoning_effort`` adds to the template's variables, as vLLM 0.32 adds it: the effort
    itself, and ``enable_thinking`` (false for ``"none"``) unless ``chat_template_kwargs`` sets it."""
    if b.reasoning_effort is None:
        return {}
    extra: dict[str, Any] = {"reasoning_effort": b.reasoning_effort}
    if "enable_thinking" not in (b.chat_template_kwargs or {}):
        extra["enable_thinking"] = b.reasoning_effort != "none"
    return extra


def _parser_kwargs(b: ChatBody) -> dict[str, Any]:
    """The template kwargs vLLM's server gives its tool and reasoning parsers (its
    ``_effective_chat_template_kwargs``): the request's ``chat_template_kwargs`` under the
    request's own template fields, those that are set (not None or ``"auto"``)."""
    extra: dict[str, Any] = {
        "add_generation_prompt": b.add_generation_prompt,
        "continue_final_message": b.continue_final_message,
        "documents": b.documents,
        **_thinking(b),
    }
    return {**(b.chat_template_kwargs or {}), **{k: v for k, v in extra.items() if v is not None and v != "auto"}}


_NO_PARSERS = ParserOptions()
_USAGE = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'


def tool_choice_of(b: ChatBody, parsers: ParserOptions, *, structured: Structured | None) -> ToolChoice:
    """``tool_choice`` checked as vLLM checks it: its pydantic validator's rules and messages
    first (``tools`` not empty, ``tool_choice`` needs ``tools``, a named function must be one
    of them, not together with a structured-output constraint), then its server's, which
    depend on the server's flags (``"auto"`` needs ``--enable-auto-tool-choice``; ``"required"``
    and a named function need a tool parser)."""
    if b.tools is not None and not b.tools:
        raise _bad(
            "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely.", "tools"
        )
    raw = b.tool_choice
    parallel = b.parallel_tool_calls is not False
    if raw is None and not b.tools:
        return ToolChoice("none", parallel=parallel)
    if raw == "none":
        return ToolChoice("none", raw=raw, parallel=parallel)
    if raw is not None and b.tools is None:
        raise _bad("When using `tool_choice`, `tools` must be set.", "tool_choice")
    name = None
    mode: ToolMode
    if raw is None:
        mode = "auto"
    elif isinstance(raw, dict):
        function = raw.get("function")
        if not isinstance(function, dict):
            raise _bad(f"Invalid value for `function`: `{function}` in `tool_choice`! {_USAGE}", "tool_choice.function")
        if "name" not in function:
            raise _bad(f"Expected field `name` in `function` in `tool_choice`! {_USAGE}", "tool_choice.function.name")
        name = function["name"]
        if not isinstance(name, str) or not name:
            raise _bad(
                f"Invalid `name` in `function`: `{name}` in `tool_choice`! {_USAGE}", "tool_choice.function.name"
            )
        if not any(
            isinstance(t, dict) and isinstance(t.get("function"), dict) and t["function"].get("name") == name
            for t in b.tools or ()
        ):
            raise _bad("The tool specified in `tool_choice` does not match any of the specified `tools`", "tool_choice")
        if structured is not None and structured.source != "response_format":
            # vLLM counts only structured_outputs' constraints here; a response_format gives way
            # to the function's schema (braid.routes.chat.constrain)
            raise _bad("You can only either use constraints for structured outputs or tools, not both.")
        mode = "named"
    elif raw in ("auto", "required"):
        mode = raw
    else:
        raise _bad(
            f'Invalid value for `tool_choice`: {raw}! Only named tools, "none", "auto" or "required" are supported.',
            "tool_choice",
        )
    if parsers.tool_call_parser is None or not parsers.enable_auto_tool_choice:
        if mode == "auto":
            raise _bad('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set')
        what = f'function "{name}"' if mode == "named" else f'"{mode}"'
        raise _bad(f"tool_choice={what} requires --tool-call-parser to be set")
    return ToolChoice(mode, name, raw, parallel)


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
    body: bytes,
    limits: Limits,
    *,
    max_model_len: int,
    batch: bool,
    trust_template: bool = False,
    parsers: ParserOptions = _NO_PARSERS,
) -> ChatRequest:
    """Decode and validate a chat body, or raise :class:`~braid.errors.InvalidRequest` (a 400).

    ``batch``: the body is for the batch route (``messages`` is a list of conversations).
    ``parsers``: the server's tool and reasoning flags, which decide what ``tool_choice`` may be.
    """
    b: ChatBody = decode_body(body, _DECODER)
    return validate_chat(
        b, limits, max_model_len=max_model_len, batch=batch, trust_template=trust_template, parsers=parsers
    )


def validate_chat(
    b: ChatBody,
    limits: Limits,
    *,
    max_model_len: int,
    batch: bool = False,
    trust_template: bool = False,
    parsers: ParserOptions = _NO_PARSERS,
) -> ChatRequest:
    """:func:`parse_chat` of a body already decoded: the checks after the schema's. Another
    dialect that is chat underneath (``/v1/messages``: :mod:`braid.wire.anthropic`) builds its
    :class:`ChatBody` and is checked here, by the same rules."""
    _check_chat(b, trust_template=trust_template)
    tools = parse_tools(b.tools)
    template = TemplateOptions(
        add_generation_prompt=b.add_generation_prompt,
        continue_final_message=b.continue_final_message,
        chat_template=b.chat_template,
        kwargs={
            **(b.chat_template_kwargs or {}),
            **({"documents": b.documents} if b.documents else {}),
            **_thinking(b),
        },
        tools=None,  # below, once tool_choice is known
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
    kv, reused = reused_prompt(carried.kv_transfer_params, batch=batch, echo=b.echo, vocab_size=limits.vocab_size)
    carried = msgspec.structs.replace(carried, kv_transfer_params=kv)
    check_fields(carried, limits, logprobs=carried.logprobs)
    if b.echo and b.prompt_logprobs is None:
        # vLLM's chat: echo reports the prompt's logprobs, at top_logprobs (0: the prompt token
        # alone), even in a stream (which does not show them); after the checks, as vLLM's
        # validators see only the fields the client sent.
        carried = msgspec.structs.replace(carried, prompt_logprobs=top)
    structured = structured_of(carried)
    tool_choice = tool_choice_of(b, parsers, structured=structured)
    if tools is not None and not (tool_choice.mode == "none" and parsers.exclude_tools_when_tool_choice_none):
        template = attrs.evolve(template, tools=tools)
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
        tools=tools,
        tool_choice=tool_choice,
        include_reasoning=b.include_reasoning,
        chat_template_kwargs=_parser_kwargs(b),
        reused_prompt=reused,
    )


__all__ = ["ChatBody", "ChatRequest", "ToolChoice", "ToolMode", "parse_chat", "tool_choice_of", "validate_chat"]
