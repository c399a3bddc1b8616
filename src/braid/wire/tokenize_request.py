"""Validate a ``POST /tokenize`` or ``POST /detokenize`` body: vLLM 0.32's request shapes.

Pure: no I/O, no engine (the model's name, vocabulary size and context length are arguments).
The checks run in vLLM's order, so a body with several faults gets vLLM's answer to it: the
body's schema (400 ``Bad Request``, ``param`` its pydantic location), the template flags, the
model (404), the request's own chat template, then the rest (400 ``BadRequestError``), last what
vLLM finds only as it renders the conversation (a malformed assistant tool call: no ``param``).
Messages are read as vLLM's ``TokenizeChatRequest`` reads them (:mod:`braid.wire.messages`:
``reasoning_content`` is not renamed there, unlike in a chat request).

``/tokenize`` takes one of two bodies, a union that vLLM's pydantic layer tries in turn:

* a text: ``{model?, prompt, add_special_tokens=true, return_token_strs=false}``;
* a chat: ``{model?, messages, add_generation_prompt=true, continue_final_message=false,
  add_special_tokens=false, chat_template?, chat_template_kwargs?, tools?, return_token_strs}``,
  rendered by the model's chat template (:func:`braid.wire.messages.render`) and then tokenized as text.

A body with ``messages`` is a chat; if it is not a valid one but is a valid text request, it is
that (vLLM's union does the same). A body that is neither is a schema error located where the
text form's first fault is (``body.prompt`` when there is no text): that is the location vLLM
reports, since pydantic lists the text form's errors first.

``/detokenize`` takes ``{model?, tokens}``: ids are integers from 0 to 2**63 - 1 (the schema);
beyond vLLM, at most :data:`DETOKENIZE_CONTEXTS` contexts' worth of them, each in the
vocabulary (400 ``BadRequestError`` naming ``tokens``; vLLM decodes an unknown id as nothing).

Types are strict, as everywhere in braid (msgspec; vLLM coerces ``"1"`` or ``1.0`` to 1).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Annotated, Any, Literal

import attrs
import msgspec

from braid.errors import InvalidRequest, ModelNotFound, SchemaError
from braid.wire.fields import INT64_MAX, decode_body
from braid.wire.messages import (
    Message,
    RenderTimeError,
    TemplateOptions,
    check_template_trusted,
    parse_messages,
    parse_tools,
)

DETOKENIZE_CONTEXTS = 4
"""``/detokenize`` takes at most this many times ``max_model_len`` token ids (decoding is work
for braid's tokenizing thread; no real prompt or completion is longer than one context)."""

EMPTY_CONVERSATION = "Cannot apply chat template to an empty conversation. Provide at least one message."

# For the JSON schema only (msgspec decodes ``messages`` as ``Any``; parse_messages checks it by
# hand): what a message of the wire format is, as far as braid reads it.
_MESSAGES_SCHEMA = {
    "description": "One conversation: a list of messages, rendered by the model's chat template.",
    "type": "array",
    "items": {
        "type": "object",
        "required": ["role"],
        "properties": {
            "role": {"type": "string", "minLength": 1},
            "content": {
                "anyOf": [{"type": "string"}, {"type": "array"}, {"type": "null"}],
                "description": "A text, or content parts (text parts only: the model takes text).",
            },
        },
    },
}


class ToolFunction(msgspec.Struct):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    defer_loading: bool | None = None


class Tool(msgspec.Struct):
    """A tool the chat template may describe to the model (OpenAI's function tool)."""

    function: ToolFunction
    type: Literal["function"] = "function"
    defer_loading: bool | None = None

    def as_template_input(self) -> dict[str, Any]:
        """The tool as vLLM hands it to the template (:func:`braid.wire.messages.parse_tools`)."""
        (tool,) = parse_tools([msgspec.to_builtins(self)]) or ()
        return tool


class TokenizePromptBody(msgspec.Struct):
    """``POST /tokenize`` with a text. Unknown fields are ignored, as in vLLM."""

    prompt: str
    model: str | None = None
    add_special_tokens: bool = True
    """Add the tokenizer's special tokens (its BOS)."""
    return_token_strs: bool | None = False
    """Also return each token as the vocabulary spells it."""


class TokenizeChatBody(msgspec.Struct):
    """``POST /tokenize`` with a conversation. Unknown fields are ignored, as in vLLM."""

    messages: Annotated[Any, msgspec.Meta(extra_json_schema=_MESSAGES_SCHEMA)]
    model: str | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    """Special tokens on top of those the template writes (false: the template writes them)."""
    return_token_strs: bool | None = False
    chat_template: str | None = None
    """Only with the server's ``--trust-request-chat-template``."""
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Tool] | None = None
    """Passed to the template as vLLM dumps them, which may describe them to the model."""
    media_io_kwargs: dict[str, dict[str, Any]] | None = None
    """Accepted and unused: the model takes text only."""
    mm_processor_kwargs: dict[str, Any] | None = None
    """Accepted and unused: the model takes text only."""


class DetokenizeBody(msgspec.Struct):
    """``POST /detokenize``. Unknown fields are ignored, as in vLLM."""

    tokens: list[Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]]
    model: str | None = None


class _Form(msgspec.Struct):
    """Which form a ``/tokenize`` body is, read without decoding its values."""

    messages: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    prompt: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


_FORM = msgspec.json.Decoder(_Form)
_PROMPT = msgspec.json.Decoder(TokenizePromptBody)
_CHAT = msgspec.json.Decoder(TokenizeChatBody)
_DETOKENIZE = msgspec.json.Decoder(DetokenizeBody)


@attrs.frozen
class TokenizeText:
    """A validated text to tokenize."""

    text: str
    add_special_tokens: bool
    return_token_strs: bool


@attrs.frozen
class TokenizeChat:
    """A validated conversation to render and tokenize."""

    messages: tuple[Message, ...]
    template: TemplateOptions
    add_special_tokens: bool
    return_token_strs: bool


@attrs.frozen
class Detokenize:
    tokens: tuple[int, ...]


Served = str | Collection[str]
"""The names a request's ``model`` may give: the model's, or it and its LoRA adapters'."""


def _check_model(requested: str | None, served: Served) -> None:
    if requested and requested not in ((served,) if isinstance(served, str) else served):
        raise ModelNotFound(f"The model `{requested}` does not exist.", param="model")


def _text(b: TokenizePromptBody, served: Served) -> TokenizeText:
    _check_model(b.model, served)
    return TokenizeText(b.prompt, b.add_special_tokens, bool(b.return_token_strs))


def _chat(body: bytes, served: Served, trust_template: bool) -> TokenizeChat:
    b: TokenizeChatBody = decode_body(body, _CHAT)
    empty = b.messages == []  # vLLM's pydantic layer takes it; its renderer refuses it, later
    late: RenderTimeError | None = None  # what vLLM finds only as it renders: after the checks below
    try:
        messages = () if empty else parse_messages(b.messages, model="tokenize")
    except RenderTimeError as exc:
        messages, late = (), exc
    kwargs = dict(b.chat_template_kwargs or {})
    template = TemplateOptions(  # both template flags: a 400 here, before the model is looked at
        add_generation_prompt=b.add_generation_prompt,
        continue_final_message=b.continue_final_message,
        chat_template=b.chat_template,
        kwargs=kwargs,
        tools=None if b.tools is None else tuple(t.as_template_input() for t in b.tools),
    )
    _check_model(b.model, served)
    kwargs_template = kwargs.get("chat_template")
    check_template_trusted(b.chat_template, kwargs, trust=trust_template)
    if b.chat_template is None and isinstance(kwargs_template, str):
        template = attrs.evolve(template, chat_template=kwargs_template)
    if empty:
        raise InvalidRequest(EMPTY_CONVERSATION)
    if late is not None:
        raise late
    return TokenizeChat(messages, template, b.add_special_tokens, bool(b.return_token_strs))


def parse_tokenize(body: bytes, *, model: Served, trust_template: bool = False) -> TokenizeText | TokenizeChat:
    """Decode and validate a ``/tokenize`` body for the model served as ``model`` (or the names,
    with its LoRA adapters' too, which use the model's tokenizer, as in vLLM): a 400 or a
    404 (:class:`~braid.errors.BraidError`) for what vLLM refuses. ``trust_template``: the
    server's ``--trust-request-chat-template``."""
    form: _Form = decode_body(body, _FORM)  # not JSON, not an object: as vLLM locates it
    if form.messages is msgspec.UNSET:
        if form.prompt is msgspec.UNSET:
            raise SchemaError(
                "Invalid request body: `prompt` (a text) or `messages` (a conversation) is required.",
                param="body.prompt",
            )
        return _text(decode_body(body, _PROMPT), model)
    try:
        return _chat(body, model, trust_template)
    except SchemaError as not_chat:
        try:
            as_text = decode_body(body, _PROMPT)
        except SchemaError as not_text:
            raise SchemaError(
                f"{not_chat.message} (and it is not a text request either: {not_text.message})",
                param=not_text.param,
            ) from None
        return _text(as_text, model)


def parse_detokenize(body: bytes, *, model: Served, vocab_size: int, max_model_len: int) -> Detokenize:
    """Decode and validate a ``/detokenize`` body (see the module docstring for the bounds)."""
    b: DetokenizeBody = decode_body(body, _DETOKENIZE)
    _check_model(b.model, model)
    cap = DETOKENIZE_CONTEXTS * max_model_len
    if len(b.tokens) > cap:
        raise InvalidRequest(
            f"tokens holds {len(b.tokens)} ids, more than the maximum of {cap} "
            f"({DETOKENIZE_CONTEXTS} x max_model_len).",
            param="tokens",
        )
    for i, t in enumerate(b.tokens):
        if t >= vocab_size:
            raise InvalidRequest(
                f"tokens[{i}]: token id {t} is out of vocabulary (vocabulary size {vocab_size}).", param="tokens"
            )
    return Detokenize(tuple(b.tokens))


__all__ = [
    "DETOKENIZE_CONTEXTS",
    "Detokenize",
    "DetokenizeBody",
    "TokenizeChat",
    "TokenizeChatBody",
    "TokenizePromptBody",
    "TokenizeText",
    "Tool",
    "ToolFunction",
    "parse_detokenize",
    "parse_tokenize",
]
