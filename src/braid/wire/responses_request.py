"""Validate a ``POST /v1/responses`` body: OpenAI's Responses API, as vLLM 0.32 serves it.

A Responses request is a chat request in another wire shape, so it is validated into a
:class:`~braid.wire.chat_request.ChatRequest` (one conversation) that the chat pipeline takes as
it is (template, tools, parsers, plan, run), plus what the response object repeats of the request
(:class:`ResponsesEcho`). The translation is vLLM's (its ``construct_input_messages``):

* ``instructions`` becomes a first system message; ``input`` a string is one user message; a
  list holds messages (``role`` and ``content``: a string or ``input_text``/``output_text``
  parts), ``function_call`` items (joined to the assistant message before them as its
  ``tool_calls``), ``function_call_output`` items (``tool`` messages) and ``reasoning`` items
  (the assistant message's ``reasoning``). A last message or reasoning item whose ``status`` is
  ``in_progress`` or ``incomplete`` is continued (``continue_final_message``), not answered.
* ``tools`` are flat function tools (``{"type": "function", "name", "parameters", ...}``), given
  to the template as chat's ``{"type": "function", "function": {...}}``; ``tool_choice`` is
  ``"auto"`` (the default), ``"none"``, ``"required"`` or ``{"type": "function", "name"}``.
  Without tools, ``"auto"`` is ``"none"``; ``"required"`` or a named function is a 400.
* ``max_output_tokens`` is chat's ``max_completion_tokens`` (none: the context's room);
  ``reasoning.effort`` is chat's ``reasoning_effort``; ``text.format`` (``json_schema``,
  ``json_object`` or ``text``) is chat's ``response_format``, and vLLM's own
  ``structured_outputs`` is taken too (not with ``text.format``);
  ``include: ["message.output_text.logprobs"]`` with ``top_logprobs`` asks for logprobs.

Refused as vLLM refuses them: a ``prompt`` template, ``background`` without ``store`` (and, on a
server without a store, ``background`` at all, as vLLM without ``VLLM_ENABLE_RESPONSES_API_STORE``).
A ``previous_response_id`` needs the previous response's history (:func:`history_of`), which the
view looks up in the store; without it, it is a 404. Tools other than function tools are a 400
(vLLM ignores them without its tool server).
"""

from __future__ import annotations

import json
from typing import Any, Literal

import attrs
import msgspec

from braid.errors import InvalidRequest, NotFound, SchemaError
from braid.settings import ParserOptions
from braid.wire.chat_request import ChatRequest, ToolChoice, ToolMode
from braid.wire.completions_request import CompletionBody
from braid.wire.fields import Limits, check_fields, check_seed, decode_body, structured_of
from braid.wire.messages import TemplateOptions, parse_messages, parse_tools
from braid.wire.structured import Structured

LOGPROBS_INCLUDE = "message.output_text.logprobs"
_INCLUDES = (
    "code_interpreter_call.outputs",
    "computer_call_output.output.image_url",
    "file_search_call.results",
    "message.input_image.image_url",
    LOGPROBS_INCLUDE,
    "reasoning.encrypted_content",
)


class ResponsesBody(msgspec.Struct, frozen=True):
    """The body of ``POST /v1/responses``: OpenAI's fields and vLLM's extra sampling fields.
    Unknown fields are ignored, as vLLM does."""

    input: Any
    instructions: str | None = None
    model: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    metadata: dict[str, str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logit_bias: dict[str, float] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stream: bool | None = False
    tools: list[Any] | None = None
    tool_choice: Any = "auto"
    parallel_tool_calls: bool | None = True
    reasoning: dict[str, Any] | None = None
    include_reasoning: bool = True
    text: dict[str, Any] | None = None
    structured_outputs: Any = None
    include: list[str] | None = None
    top_logprobs: int | None = 0
    store: bool | None = True
    background: bool | None = False
    previous_response_id: str | None = None
    prompt: Any = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] = "auto"
    truncation: Literal["auto", "disabled"] | None = "disabled"
    user: str | None = None
    request_id: str | None = None
    priority: int = 0
    chat_template_kwargs: dict[str, Any] | None = None


_DECODER = msgspec.json.Decoder(ResponsesBody)
_NO_PARSERS = ParserOptions()

_FORMAT_LOC = "body.text.format.ResponseFormatText.type"
_REASONING_KEYS = ("context", "effort", "generate_summary", "mode", "summary")
_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")


@attrs.frozen
class ResponsesEcho:
    """What the response object repeats of the request (vLLM's ``ResponsesResponse.from_request``),
    as JSON values in vLLM's dump of them."""

    instructions: str | None
    metadata: dict[str, str] | None
    tools: tuple[dict[str, Any], ...]
    tool_choice: object
    text: dict[str, Any] | None
    reasoning: dict[str, Any] | None
    parallel_tool_calls: bool
    temperature: float
    top_p: float
    presence_penalty: float
    frequency_penalty: float
    service_tier: str
    truncation: str
    user: str | None
    max_tool_calls: int | None
    top_logprobs: int | None
    """Alternatives per token when logprobs are asked for (``include``); None otherwise."""
    previous_response_id: str | None = None
    background: bool = False


@attrs.frozen
class ResponsesRequest:
    """A validated Responses request: its chat request and what the response repeats."""

    chat: ChatRequest
    echo: ResponsesEcho
    request_id: str | None
    """The body's ``request_id``: the response's id when given (vLLM's)."""
    messages: tuple[dict[str, Any], ...] = ()
    """The conversation as chat messages (JSON values): what a stored response keeps for the
    next turn (:func:`history_of`)."""
    store: bool = False
    """``store``: keep the answer (on a server with a store)."""
    background: bool = False
    """``background``: answer at once, run in the background (on a server with a store)."""

    @property
    def stream(self) -> bool:
        return bool(self.chat.body.stream)


def _bad(message: str, param: str | None = None) -> InvalidRequest:
    return InvalidRequest(message, param=param)


def _text_of(content: object) -> str | None:
    """An output message's text (vLLM takes its first part's)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and isinstance(content[0], dict):
        text = content[0].get("text")
        return text if isinstance(text, str) else None
    return None


def _bad_item(i: int, why: str) -> SchemaError:
    return SchemaError(f"input[{i}]: {why}", param="body.input")


def _call(item: dict[str, Any], i: int) -> dict[str, Any]:
    for key in ("call_id", "name", "arguments"):
        if not isinstance(item.get(key), str):
            raise _bad_item(i, f"a function_call item needs a string `{key}`.")
    return {
        "id": item["call_id"],
        "type": "function",
        "function": {"name": item["name"], "arguments": item["arguments"]},
    }


def _messages(
    instructions: str | None, value: object, history: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], bool]:
    """``instructions``, the previous turns' ``history`` and ``input`` as chat messages (vLLM's
    ``construct_input_messages``), and whether the last one is continued rather than answered."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    messages.extend(history)
    if isinstance(value, str):
        messages.append({"role": "user", "content": value})
        return messages, False
    if not isinstance(value, list):
        raise SchemaError("input must be a string or a list of items.", param="body.input")
    base = len(messages)
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise _bad_item(i, "an item must be an object.")
        kind = item.get("type", "message")
        prev = messages[-1] if len(messages) > base and messages[-1].get("role") == "assistant" else None
        if kind == "function_call":
            call = _call(item, i)
            if prev is not None:
                prev.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str) or not isinstance(item.get("output"), str | list):
                raise _bad_item(i, "a function_call_output item needs a string `call_id` and an `output`.")
            messages.append({"role": "tool", "content": item["output"], "tool_call_id": item["call_id"]})
        elif kind == "reasoning":
            if item.get("encrypted_content"):
                raise _bad("Encrypted content is not supported.", "input")
            parts = item.get("content") or item.get("summary") or []
            if not isinstance(parts, list):
                raise _bad_item(i, "a reasoning item's `content` must be a list.")
            reasoning = _text_of(parts) or ""
            if prev is not None and prev.get("reasoning") is None:
                prev["reasoning"] = reasoning
            else:
                messages.append({"role": "assistant", "content": None, "reasoning": reasoning})
        elif kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise _bad_item(i, "a message needs a `role`: user, system, developer or assistant.")
            content = item.get("content")
            if not isinstance(content, str | list):
                raise _bad_item(i, "a message needs a `content`: a string or a list of parts.")
            if role == "assistant":
                text = _text_of(content)
                if text is None:
                    raise _bad_item(i, "an assistant message needs text content.")
                if prev is not None and prev.get("content") is None:
                    prev["content"] = text
                else:
                    messages.append({"role": "assistant", "content": text})
            else:
                messages.append({"role": role, "content": content})
        else:
            raise _bad_item(i, f"unsupported input item type {kind!r}.")
    last = value[-1] if value else None
    continued = (
        isinstance(last, dict)
        and last.get("type", "message") in ("message", "reasoning")
        and last.get("status") in ("in_progress", "incomplete")
    )
    return messages, continued


def _function_tool(t: object, i: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """A flat function tool: (chat's tool, vLLM's dump of it for the response)."""
    # pydantic locates a fault in the first member of vLLM's tool union: FunctionTool
    loc = f"body.tools.{i}.FunctionTool"
    if not isinstance(t, dict):
        raise SchemaError("a tool must be an object.", param=loc)
    if t.get("type") != "function":
        raise _bad(f"tools[{i}]: only function tools are supported, got type {t.get('type')!r}.", "tools")
    name = t.get("name")
    if not isinstance(name, str):
        raise SchemaError("a function tool needs a string `name`.", param=f"{loc}.name")
    parameters = t.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise SchemaError("`parameters` must be an object.", param=f"{loc}.parameters")
    description = t.get("description")
    if description is not None and not isinstance(description, str):
        raise SchemaError("`description` must be a string.", param=f"{loc}.description")
    strict = t.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise SchemaError("`strict` must be a boolean.", param=f"{loc}.strict")
    function: dict[str, Any] = {"name": name, "description": description, "parameters": parameters}
    if strict is not None:
        function["strict"] = strict
    dump = {
        "name": name,
        "parameters": parameters,
        "strict": strict,
        "type": "function",
        "allowed_callers": None,
        "async": None,
        "defer_loading": None,
        "description": description,
        "output_schema": None,
    }
    return {"type": "function", "function": function}, dump


def _tool_choice(b: ResponsesBody, names: list[str], parsers: ParserOptions) -> tuple[ToolChoice, object]:
    """``tool_choice`` as vLLM's Responses model checks it: (the chat pipeline's choice, its echo)."""
    raw = b.tool_choice
    named = isinstance(raw, dict) and raw.get("type") == "function"
    parallel = b.parallel_tool_calls is not False
    if not names:
        if raw in ("auto", "none"):
            return ToolChoice("none", parallel=parallel), "none"
        if raw == "required":
            raise _bad("Tool choice 'required' must be specified with 'tools' parameter.", "tool_choice")
        if named:
            raise _bad("Tool choice 'function' not found in 'tools' parameter.", "tool_choice")
    mode: ToolMode
    name = None
    if named:
        assert isinstance(raw, dict)
        name = raw.get("name")
        if not name or name not in names:
            raise _bad("Tool choice 'function' not found in 'tools' parameter.", "tool_choice")
        mode = "named"
        echo: object = {"name": name, "type": "function"}
    elif raw in ("auto", "none", "required"):
        mode = raw
        echo = raw
    else:
        raise SchemaError(f"Invalid tool_choice: {raw!r}.", param="body.tool_choice")
    if mode != "none" and parsers.tool_call_parser is None:
        # vLLM's Responses server parses nothing without a tool parser: the text is the answer.
        return ToolChoice("none", parallel=parallel), echo
    chat_raw = {"type": "function", "function": {"name": name}} if mode == "named" else raw
    return ToolChoice(mode, name, chat_raw, parallel), echo


def _text_format(text: dict[str, Any] | None) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """``text.format``: (chat's ``response_format``, vLLM's dump of ``text``)."""
    if text is None:
        return None, None
    fmt = text.get("format")
    echo: dict[str, Any] = {"format": None, "verbosity": text.get("verbosity")}
    if fmt is None:
        return None, echo
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        echo["format"] = {"type": "text"}
        return None, echo
    if kind == "json_object":
        echo["format"] = {"type": "json_object"}
        return {"type": "json_object"}, echo
    if kind == "json_schema" and isinstance(fmt.get("name"), str) and isinstance(fmt.get("schema"), dict):
        name, schema = fmt["name"], fmt["schema"]
        echo["format"] = {
            "name": name,
            "schema": schema,
            "type": "json_schema",
            "description": fmt.get("description"),
            "strict": fmt.get("strict"),
        }
        return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}, echo
    # vLLM's pydantic locates any fault at the first member of the format union
    raise SchemaError(
        "text.format must be {type: text}, {type: json_object} or {type: json_schema, name, schema}.",
        param=_FORMAT_LOC,
    )


def _reasoning(value: dict[str, Any] | None) -> tuple[str | None, dict[str, Any] | None]:
    if value is None:
        return None, None
    effort = value.get("effort")
    if effort is not None and effort not in _EFFORTS:
        raise SchemaError(f"reasoning.effort must be one of {', '.join(_EFFORTS)}.", param="body.reasoning.effort")
    return effort, {k: value.get(k) for k in _REASONING_KEYS}


def _check(b: ResponsesBody) -> None:
    if b.prompt is not None:
        raise _bad("prompt template is not supported", "prompt")
    if b.background and b.store is False:
        raise _bad("background can only be used when `store` is true", "background")
    check_seed(b.seed)
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(b, name)
        if value is not None and not -2.0 <= value <= 2.0:
            raise SchemaError(f"{name} must be in [-2, 2], got {value}.", param=f"body.{name}")
    for i, inc in enumerate(b.include or ()):
        if inc not in _INCLUDES:
            raise SchemaError(f"include[{i}] is not one of {', '.join(_INCLUDES)}.", param=f"body.include.{i}")


def decode_responses(body: bytes) -> ResponsesBody:
    """The body decoded, or a :class:`~braid.errors.SchemaError` located as vLLM's pydantic locates it."""
    return decode_body(body, _DECODER)


def history_of(messages: bytes, body: bytes) -> list[dict[str, Any]]:
    """What a stored response adds to the next turn's conversation, as vLLM's Responses server
    builds it: the messages it answered (its system messages left out: instructions do not carry
    over), then the text of each of its output messages as an assistant message (its reasoning
    and its function calls are not carried over, as in vLLM 0.32)."""
    history = [m for m in json.loads(messages) if m.get("role") != "system"]
    for item in json.loads(body).get("output", []):
        if item.get("type") == "message":
            history.extend({"role": "assistant", "content": part.get("text")} for part in item.get("content", []))
    return history


def parse_responses(
    body: bytes, limits: Limits, *, max_model_len: int, parsers: ParserOptions = _NO_PARSERS
) -> ResponsesRequest:
    """:func:`decode_responses` then :func:`validate_responses`, on a server that stores nothing
    (a ``previous_response_id`` is a 404)."""
    return validate_responses(decode_responses(body), limits, max_model_len=max_model_len, parsers=parsers)


def validate_responses(
    b: ResponsesBody,
    limits: Limits,
    *,
    max_model_len: int,
    parsers: ParserOptions = _NO_PARSERS,
    history: list[dict[str, Any]] | None = None,
    background: bool = False,
) -> ResponsesRequest:
    """Validate a decoded Responses body, or raise :class:`~braid.errors.InvalidRequest` (a 400;
    :class:`~braid.errors.NotFound` for a ``previous_response_id`` without its ``history``).
    ``parsers``: the server's tool and reasoning flags; ``history``: the previous response's
    (:func:`history_of`), which the caller looked up; ``background``: the server runs
    ``background`` requests (it has a store)."""
    _check(b)
    if b.background and not background:
        raise ResponsesInvalid(
            "This braid server does not store responses and therefore does not support the background mode.",
            param="background",
        )
    effort, reasoning_echo = _reasoning(b.reasoning)
    response_format, text_echo = _text_format(b.text)
    if response_format is not None and b.structured_outputs is not None:
        raise _bad("Cannot specify both structured_outputs and text.format", "structured_outputs")
    chat_tools, dumps = [], []
    for i, t in enumerate(b.tools or ()):
        tool, dump = _function_tool(t, i)
        chat_tools.append(tool)
        dumps.append(dump)
    tools = parse_tools(chat_tools) if chat_tools else None
    tool_choice, choice_echo = _tool_choice(b, [d["name"] for d in dumps], parsers)
    logprobs = LOGPROBS_INCLUDE in (b.include or ())
    top = b.top_logprobs or 0
    carried = CompletionBody(
        model=b.model,
        max_tokens=max_model_len if b.max_output_tokens is None else b.max_output_tokens,
        temperature=b.temperature,
        top_p=b.top_p,
        top_k=b.top_k,
        min_p=b.min_p,
        presence_penalty=b.presence_penalty,
        frequency_penalty=b.frequency_penalty,
        repetition_penalty=b.repetition_penalty,
        seed=b.seed,
        stop=b.stop,
        stop_token_ids=b.stop_token_ids,
        ignore_eos=b.ignore_eos,
        logit_bias=b.logit_bias,
        skip_special_tokens=b.skip_special_tokens,
        include_stop_str_in_output=b.include_stop_str_in_output,
        stream=bool(b.stream),
        request_id=b.request_id,
        user=b.user,
        priority=b.priority,
        service_tier=b.service_tier,
        structured_outputs=b.structured_outputs,
        response_format=response_format,
        logprobs=top if logprobs else None,
        # vLLM's Responses requests tokenize the rendered template with the tokenizer's special
        # tokens (chat's default is without): the tiny model's prompt starts with two BOS.
        add_special_tokens=True,
    )
    check_fields(carried, limits, logprobs=carried.logprobs)
    structured: Structured | None = structured_of(carried)
    thinking: dict[str, Any] = {}
    if effort is not None:
        thinking["reasoning_effort"] = effort
        if "enable_thinking" not in (b.chat_template_kwargs or {}):
            thinking["enable_thinking"] = effort != "none"
    if b.previous_response_id is not None and history is None:
        raise ResponseNotFound(b.previous_response_id)
    messages, continued = _messages(b.instructions, b.input, history or [])
    if not messages:
        raise _bad("Cannot apply chat template to an empty conversation. Provide at least one message.")
    template = TemplateOptions(
        add_generation_prompt=not continued,
        continue_final_message=continued,
        kwargs={**(b.chat_template_kwargs or {}), **thinking},
        tools=tools
        if tools and not (tool_choice.mode == "none" and parsers.exclude_tools_when_tool_choice_none)
        else None,
    )
    try:
        conversation = parse_messages(messages, "input", model="chat")
    except SchemaError as exc:
        exc.param = "body.input"
        raise
    parser_kwargs = {
        **(b.chat_template_kwargs or {}),
        "add_generation_prompt": not continued,
        "continue_final_message": continued,
        **thinking,
    }
    chat = ChatRequest(
        conversations=(conversation,),
        template=template,
        body=carried,
        structured=structured,
        logprobs=logprobs,
        top_logprobs=top,
        echo=False,
        batch=False,
        tools=tools,
        tool_choice=tool_choice,
        include_reasoning=b.include_reasoning,
        chat_template_kwargs=parser_kwargs,
    )
    echo = ResponsesEcho(
        instructions=b.instructions,
        metadata=b.metadata,
        tools=tuple(dumps),
        tool_choice=choice_echo,
        text=text_echo,
        reasoning=reasoning_echo,
        parallel_tool_calls=b.parallel_tool_calls if b.parallel_tool_calls is not None else True,
        temperature=1.0 if b.temperature is None else b.temperature,
        top_p=1.0 if b.top_p is None else b.top_p,
        presence_penalty=b.presence_penalty or 0.0,
        frequency_penalty=b.frequency_penalty or 0.0,
        service_tier=b.service_tier,
        truncation=b.truncation or "disabled",
        user=b.user,
        max_tool_calls=b.max_tool_calls,
        top_logprobs=top if logprobs else None,
        previous_response_id=b.previous_response_id,
        background=bool(b.background),
    )
    return ResponsesRequest(
        chat, echo, b.request_id, tuple(messages), store=b.store is not False, background=bool(b.background)
    )


class ResponsesInvalid(InvalidRequest):
    """A 400 that vLLM's Responses server answers with OpenAI's error type."""

    type = "invalid_request_error"


class ResponseNotFound(NotFound):
    """A ``previous_response_id`` (or a stored response's id) this server does not have; vLLM
    answers it with this type and ``param``."""

    type = "invalid_request_error"

    def __init__(self, response_id: str) -> None:
        super().__init__(f"Response with id '{response_id}' not found.", param="response_id")


def tool_calling_text(schema: str) -> dict[str, Any]:
    """The ``text`` vLLM's tool parser puts on a request it forces to call (``"required"``, a
    named function): the calls' JSON schema as its ``text.format``, which the response repeats."""
    return {
        "format": {
            "name": "tool_calling_response",
            "schema": json.loads(schema),
            "type": "json_schema",
            "description": None,
            "strict": True,
        },
        "verbosity": None,
    }


__all__ = [
    "LOGPROBS_INCLUDE",
    "ResponseNotFound",
    "ResponsesInvalid",
    "ResponsesBody",
    "ResponsesEcho",
    "ResponsesRequest",
    "decode_responses",
    "history_of",
    "parse_responses",
    "validate_responses",
    "tool_calling_text",
]
