"""Validate an Anthropic Messages body (``POST /v1/messages`` and ``/v1/messages/count_tokens``)
and turn it into a chat request. Pure.

Anthropic's Messages API is chat underneath, as vLLM 0.32 serves it
(``vllm/entrypoints/anthropic/serving.py``): the body is decoded strictly into
:class:`MessagesBody` (or :class:`CountTokensBody`), its own rules are checked
(``max_tokens`` positive, a ``"tool"`` choice names its tool, a thinking budget below
``max_tokens``), and it is translated into a :class:`~braid.wire.chat_request.ChatBody`, which
:func:`~braid.wire.chat_request.validate_chat` checks by chat's own rules: one pipeline, one set of
sampling, template, tool and reasoning rules for both dialects. The translation is vLLM's:

* ``system`` (a string, or text blocks joined without a separator) becomes a leading system
  message; a text block starting with Claude Code's ``x-anthropic-billing-header`` is dropped.
  A ``system`` message inside ``messages`` stays where it is, unless the model's template refuses
  system messages after the first turn (``merge_inline_system``), when its text joins the leading
  one.
* A message's blocks: ``text`` becomes content (one text block: a plain string), ``thinking`` the
  message's ``reasoning``, ``tool_use`` an assistant ``tool_calls`` entry (``input`` as its JSON
  ``arguments``), a user's ``tool_result`` a ``tool`` message before the user's own (its text
  blocks joined by newlines); ``redacted_thinking`` and ``tool_reference`` are dropped. A user
  message left with no content is dropped.
* ``tools`` become function tools (``input_schema`` the parameters, ``type: object`` added when it
  has no type); ``tool_choice`` ``auto``/``any``/``none``/``tool`` become ``"auto"``,
  ``"required"``, ``"none"`` and a named function, ``disable_parallel_tool_use`` the inverse of
  ``parallel_tool_calls``; a ``tool_choice`` without ``tools`` is dropped.
* ``thinking`` ``disabled`` sets the template's ``reasoning_effort`` to ``disabled_effort``
  (``"none"``, or ``"low"`` for a template that ignores ``"none"``: vLLM probes the template the
  same way, :func:`braid.routes.anthropic.template_traits`); ``enabled`` (a thinking token budget)
  is refused: braid has no thinking budget (vLLM refuses it too unless its server has a
  ``--reasoning-config``); ``adaptive`` changes nothing. ``output_config.effort`` is the
  ``reasoning_effort``, ``output_config.format`` a JSON-schema ``response_format``.
* ``max_tokens`` is chat's ``max_completion_tokens``, ``stop_sequences`` its ``stop``; a stream
  always reports usage (its ``message_delta`` carries it).

Unknown fields are ignored, as vLLM's pydantic model ignores them (``metadata`` is one).
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any, Literal

import msgspec

from braid.errors import InvalidRequest, SchemaError
from braid.settings import ParserOptions
from braid.wire.chat_request import ChatBody, ChatRequest, validate_chat
from braid.wire.fields import Limits, decode_body

_BILLING_HEADER = "x-anthropic-billing-header"

BlockType = Literal["text", "image", "tool_use", "tool_result", "tool_reference", "thinking", "redacted_thinking"]


class ContentBlock(msgspec.Struct, frozen=True):
    """One content block of a message or of ``system``: the fields of every block type, as
    vLLM's model has them (which fields a type reads is the translation's business)."""

    type: BlockType
    text: str | None = None
    source: dict[str, Any] | None = None
    id: str | None = None
    tool_use_id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    content: str | list[dict[str, Any]] | None = None
    is_error: bool | None = None
    tool_name: str | None = None
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None


class AnthropicMessage(msgspec.Struct, frozen=True):
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


class AnthropicTool(msgspec.Struct, frozen=True):
    name: str
    input_schema: dict[str, Any]
    description: str | None = None
    strict: bool | None = None
    defer_loading: bool | None = None


class AnthropicToolChoice(msgspec.Struct, frozen=True):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingEnabled(msgspec.Struct, frozen=True, tag_field="type", tag="enabled"):
    budget_tokens: Annotated[int, msgspec.Meta(ge=1024)]
    display: Literal["summarized", "omitted", "updates"] | None = None


class ThinkingDisabled(msgspec.Struct, frozen=True, tag_field="type", tag="disabled"):
    pass


class ThinkingAdaptive(msgspec.Struct, frozen=True, tag_field="type", tag="adaptive"):
    display: Literal["summarized", "omitted", "updates"] | None = None


Thinking = ThinkingEnabled | ThinkingDisabled | ThinkingAdaptive
Effort = Literal["low", "medium", "high", "xhigh", "max"]


class OutputFormat(msgspec.Struct, frozen=True):
    type: Literal["json_schema"] = "json_schema"
    schema: dict[str, Any] | None = None


class OutputConfig(msgspec.Struct, frozen=True):
    effort: Effort | None = None
    format: OutputFormat | None = None


class CountTokensBody(msgspec.Struct, frozen=True):
    """The body of ``POST /v1/messages/count_tokens``: a conversation without sampling fields."""

    model: str
    messages: list[AnthropicMessage]
    system: str | list[ContentBlock] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class MessagesBody(CountTokensBody, frozen=True):
    """The body of ``POST /v1/messages`` (``max_tokens`` is required, as Anthropic has it)."""

    max_tokens: int | msgspec.UnsetType = msgspec.UNSET
    stop_sequences: list[str] | None = None
    stream: bool | None = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: dict[str, Any] | None = None
    kv_transfer_params: dict[str, Any] | None = None


_MESSAGES = msgspec.json.Decoder(MessagesBody)
_COUNT = msgspec.json.Decoder(CountTokensBody)


def _check(b: CountTokensBody) -> None:
    """vLLM's pydantic validators of the body: their faults are schema errors (``Bad Request``)."""
    if not b.model:
        raise SchemaError("Model is required", param="body.model")
    if b.tool_choice is not None and b.tool_choice.type == "tool" and not b.tool_choice.name:
        raise SchemaError("tool_choice.name is required when type is 'tool'", param="body.tool_choice")
    if isinstance(b, MessagesBody):
        if b.max_tokens is msgspec.UNSET:
            # decoded with a default so that the message names the field as pydantic's does
            raise SchemaError("Field required: max_tokens", param="body.max_tokens")
        if b.max_tokens <= 0:
            raise SchemaError("max_tokens must be positive", param="body.max_tokens")
        if isinstance(b.thinking, ThinkingEnabled) and b.thinking.budget_tokens >= b.max_tokens:
            raise SchemaError("thinking.budget_tokens must be less than max_tokens", param="body")
    if isinstance(b.thinking, ThinkingEnabled):
        # braid has no thinking budget; refused rather than ignored (vLLM: without --reasoning-config too)
        raise InvalidRequest(
            "thinking.type 'enabled' (a thinking token budget) is not supported by braid: "
            "use 'adaptive', or 'disabled'",
            param="thinking",
        )


# -- the translation into chat's wire form (the JSON values a chat body would carry)


def _text_of_blocks(blocks: list[ContentBlock]) -> list[str]:
    return [b.text for b in blocks if b.type == "text" and b.text and not b.text.startswith(_BILLING_HEADER)]


def _system_text(content: str | list[ContentBlock]) -> str | None:
    if isinstance(content, str):
        return None if content.startswith(_BILLING_HEADER) else content
    parts = _text_of_blocks(content)
    return "".join(parts) if parts else None


def _image_url(source: dict[str, Any]) -> str:
    if source.get("type") == "url":
        return str(source.get("url", ""))
    return f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"


def _tool_result(block: ContentBlock) -> list[dict[str, Any]]:
    """A user's ``tool_result`` as chat messages: the ``tool`` message, then a user message with
    its images, if any."""
    text = ""
    images: list[str] = []
    if isinstance(block.content, str):
        text = block.content
    elif isinstance(block.content, list):
        texts = []
        for item in block.content:
            kind = item.get("type")
            if kind == "text":
                texts.append(str(item.get("text", "")))
            elif kind == "image":
                images.append(_image_url(item.get("source") or {}))
        text = "\n".join(texts)
    out: list[dict[str, Any]] = [{"role": "tool", "tool_call_id": block.tool_use_id or "", "content": text}]
    if images:
        out.append({"role": "user", "content": [{"type": "image_url", "image_url": {"url": u}} for u in images]})
    return out


def _message(msg: AnthropicMessage, out: list[dict[str, Any]]) -> None:
    """Append one user or assistant message (and the ``tool`` messages its results become) to ``out``."""
    chat: dict[str, Any] = {"role": msg.role}
    if isinstance(msg.content, str):
        chat["content"] = msg.content
        out.append(chat)
        return
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for block in msg.content:
        if block.type == "text" and block.text:
            parts.append({"type": "text", "text": block.text})
        elif block.type == "image" and block.source:
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block.source)}})
        elif block.type == "thinking" and block.thinking is not None:
            reasoning.append(block.thinking)
        elif block.type == "tool_use":
            calls.append(
                {
                    "id": block.id or f"call_{int(time.time())}",
                    "type": "function",
                    "function": {"name": block.name or "", "arguments": json.dumps(block.input or {})},
                }
            )
        elif block.type == "tool_result":
            if msg.role == "user":
                out.extend(_tool_result(block))
            else:
                # vLLM writes the result's Python text (a list of blocks as its repr)
                parts.append({"type": "text", "text": f"Tool result: {block.content if block.content else ''}"})
    if reasoning:
        chat["reasoning"] = "".join(reasoning)
    if calls:
        chat["tool_calls"] = calls
    if len(parts) == 1 and parts[0]["type"] == "text":
        chat["content"] = parts[0]["text"]
    elif parts:
        chat["content"] = parts
    if msg.role == "user" and "content" not in chat:
        return
    out.append(chat)


def chat_messages(b: CountTokensBody, *, merge_inline_system: bool) -> list[dict[str, Any]]:
    """The conversation in chat's wire form (see the module docstring)."""
    out: list[dict[str, Any]] = []
    system: list[str] = []
    if isinstance(b.system, str):
        if b.system:
            system.append(b.system)
    elif b.system:
        system.extend(_text_of_blocks(b.system))
    if merge_inline_system:
        system.extend(t for m in b.messages if m.role == "system" and (t := _system_text(m.content)))
    if system:
        out.append({"role": "system", "content": "".join(system)})
    for msg in b.messages:
        if msg.role == "system":
            if not merge_inline_system and (text := _system_text(msg.content)):
                out.append({"role": "system", "content": text})
            continue
        _message(msg, out)
    return out


def _tools(tools: list[AnthropicTool]) -> list[dict[str, Any]]:
    out = []
    for t in tools:
        schema = t.input_schema if "type" in t.input_schema else {**t.input_schema, "type": "object"}
        function: dict[str, Any] = {"name": t.name, "parameters": schema}
        if t.description is not None:
            function["description"] = t.description
        if t.strict is not None:
            function["strict"] = t.strict
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: AnthropicToolChoice) -> object:
    if choice.type == "any":
        return "required"
    if choice.type == "tool":
        return {"type": "function", "function": {"name": choice.name}}
    return choice.type


def chat_body(b: CountTokensBody, *, merge_inline_system: bool, disabled_effort: str) -> ChatBody:
    """The chat body ``b`` is, field by field (see the module docstring)."""
    effort: str | None = None
    response_format = None
    if b.output_config is not None:
        effort = b.output_config.effort
        fmt = b.output_config.format
        if fmt is not None and fmt.schema:
            response_format = {"type": "json_schema", "json_schema": {"name": fmt.type, "schema": fmt.schema}}
    if isinstance(b.thinking, ThinkingDisabled):
        effort = disabled_effort
    fields: dict[str, Any] = {
        "model": b.model,
        "messages": chat_messages(b, merge_inline_system=merge_inline_system),
        "chat_template_kwargs": b.chat_template_kwargs,
        "reasoning_effort": effort,
        "response_format": response_format,
    }
    if b.tools is not None:
        fields["tools"] = _tools(b.tools)
    if b.tool_choice is not None and b.tools is not None:
        # without tools vLLM drops the choice (it sets it on its chat request after validation)
        fields["tool_choice"] = _tool_choice(b.tool_choice)
        fields["parallel_tool_calls"] = not b.tool_choice.disable_parallel_tool_use
    if isinstance(b, MessagesBody):
        stream = bool(b.stream)
        fields.update(
            max_completion_tokens=b.max_tokens,
            stop=b.stop_sequences,
            temperature=b.temperature,
            top_p=b.top_p,
            top_k=b.top_k,
            stream=stream,
            stream_options={"include_usage": True} if stream else None,
            kv_transfer_params=b.kv_transfer_params,
        )
    try:
        return msgspec.convert(fields, ChatBody)
    except msgspec.ValidationError as exc:  # a field of the translation chat's schema refuses
        raise SchemaError(f"Invalid request body: {exc}") from None


def parse_messages_body(
    body: bytes,
    limits: Limits,
    *,
    max_model_len: int,
    trust_template: bool,
    parsers: ParserOptions,
    merge_inline_system: bool,
    disabled_effort: str,
    count_tokens: bool = False,
) -> ChatRequest:
    """Decode and validate a Messages body (``count_tokens``: the counting route's), as a chat
    request; a 400 (:class:`~braid.errors.InvalidRequest`) for a body either dialect refuses."""
    b: CountTokensBody = decode_body(body, _COUNT) if count_tokens else decode_body(body, _MESSAGES)
    _check(b)
    chat = chat_body(b, merge_inline_system=merge_inline_system, disabled_effort=disabled_effort)
    return validate_chat(
        chat, limits, max_model_len=max_model_len, batch=False, trust_template=trust_template, parsers=parsers
    )


__all__ = [
    "AnthropicMessage",
    "AnthropicTool",
    "AnthropicToolChoice",
    "ContentBlock",
    "CountTokensBody",
    "MessagesBody",
    "chat_body",
    "chat_messages",
    "parse_messages_body",
]
