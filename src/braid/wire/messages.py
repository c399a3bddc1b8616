"""Chat: messages -> one prompt text, rendered with the model's chat template.

Pure apart from the tokenizer's template call. :func:`parse_messages` turns one conversation of
the wire format into :class:`Message` values (text only: a text-only model refuses images and
audio with a 400), and :func:`render` applies the chat template to it, as vLLM's server does
before it tokenizes a chat request: the template's output is a text, which is then tokenized
like a completions prompt (``add_special_tokens`` false by default for chat: the template
writes the special tokens itself).

Content given as a list of parts is flattened to its text parts joined by newlines, which is
what vLLM hands a template that reads ``message['content']`` as a string.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from braid.engine.base import Tokenizer
from braid.errors import InvalidRequest, SchemaError

TEXT_PART_TYPES = frozenset({"text", "input_text"})
"""Content part types that carry text; any other part is content a text-only model cannot take."""


@attrs.frozen
class Message:
    role: str
    content: str | None
    """The text (parts joined by newlines); None for an assistant message with no content."""

    def as_template_input(self) -> dict[str, Any]:
        return {"role": self.role, "content": self.content if self.content is not None else ""}


@attrs.frozen
class TemplateOptions:
    """How a conversation is rendered: vLLM's request fields of the same names."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    """A request's own template (only when the server allows it: ``--trust-request-chat-template``)."""
    kwargs: Mapping[str, Any] = attrs.field(factory=dict)
    """``chat_template_kwargs`` (and ``documents``), passed to the template as variables."""

    def __attrs_post_init__(self) -> None:
        if self.add_generation_prompt and self.continue_final_message:
            raise InvalidRequest(
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
            )


def _content(value: object, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise SchemaError(f"{where}.content must be a string or a list of content parts.", param=f"{where}.content")
    texts = []
    for j, part in enumerate(value):
        if isinstance(part, str):
            texts.append(part)
            continue
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise SchemaError(f"{where}.content[{j}] must be a content part object with a type.")
        kind = part["type"]
        if kind not in TEXT_PART_TYPES:
            raise InvalidRequest(
                f"{where}.content[{j}] has type {kind!r}: this model takes text only "
                "(images, audio, video and files need a multimodal model)."
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise SchemaError(f"{where}.content[{j}].text must be a string.")
        texts.append(text)
    return "\n".join(texts)


def parse_messages(value: object, where: str = "messages") -> tuple[Message, ...]:
    """One conversation of the wire format; :class:`InvalidRequest` (400) for what cannot be one."""
    if not isinstance(value, list):
        raise SchemaError(f"{where} must be a list of messages.", param=where)
    if not value:
        raise InvalidRequest(f"{where} must hold at least one message.")
    out = []
    for i, m in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(m, dict):
            raise SchemaError(f"{at} must be a message object.")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise SchemaError(f"{at}.role must be a non-empty string.", param=f"{at}.role")
        out.append(Message(role, _content(m.get("content"), at)))
    return tuple(out)


def response_role(messages: Sequence[Message], options: TemplateOptions) -> str:
    """The role of the reply: ``assistant`` after a generation prompt, else the last message's
    (a continued message keeps its role), as vLLM's server decides it."""
    return "assistant" if options.add_generation_prompt else messages[-1].role


def echo_text(messages: Sequence[Message], role: str) -> str:
    """What ``echo`` puts before the reply: the last message's content when it has the reply's role."""
    last = messages[-1]
    return last.content or "" if last.role == role else ""


def render(tokenizer: Tokenizer, messages: Sequence[Message], options: TemplateOptions) -> str:
    """The conversation as the model's chat template writes it. A model without a template, or a
    template that fails on this conversation, is a 400 (never a guess at a format)."""
    try:
        return tokenizer.apply_chat_template(
            [m.as_template_input() for m in messages],
            add_generation_prompt=options.add_generation_prompt,
            continue_final_message=options.continue_final_message,
            chat_template=options.chat_template,
            template_kwargs=options.kwargs,
        )
    except InvalidRequest:
        raise
    except Exception as exc:  # noqa: BLE001  # jinja's and the tokenizer's errors: the request's template input
        raise InvalidRequest(f"The chat template could not be applied: {exc}", param="messages") from None


__all__ = ["Message", "TemplateOptions", "echo_text", "parse_messages", "render", "response_role"]
