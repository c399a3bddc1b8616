"""Validate a chat body: ``/v1/chat/completions`` (one conversation) and its batch route.

A chat request is a completions request whose prompts are rendered from messages. So the body is
decoded by msgspec in strict mode into :class:`ChatBody`, the chat-only rules are checked here
(messages, template flags, ``logprobs``/``top_logprobs``, tools), and its sampling fields are
carried over into a :class:`~braid.request.CompletionBody` that the completions checks and
:func:`~braid.request.build_request` take as they are: one set of sampling rules for both routes.
The prompts are rendered later, by the view (:func:`braid.chat.render`), because the template
belongs to the engine's tokenizer.

vLLM's chat differences kept here: ``max_completion_tokens`` wins over ``max_tokens``, and with
neither the reply may fill the context's room (not 16 tokens); ``add_special_tokens`` is false by
default; ``logprobs`` is a boolean and ``top_logprobs`` the count; ``echo`` repeats the last
message's text, not prompt tokens. Tools are refused unless ``tool_choice`` is ``"none"`` (braid
does not parse tool calls), and a request's own ``chat_template`` needs the server's
``--trust-request-chat-template``.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs
import msgspec

from braid.chat import Message, TemplateOptions, parse_messages
from braid.errors import InvalidRequest
from braid.request import CompletionBody, Limits, StreamOptions, _check_fields, decode_body


class ChatBody(msgspec.Struct):
    """The body of ``POST /v1/chat/completions`` (``messages``: one conversation) and of its batch
    route (``messages``: a list of conversations). Unknown fields are ignored, as in vLLM."""

    messages: Any = None
    model: str | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    logit_bias: dict[str, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    echo: bool = False
    logprobs: bool | None = None
    top_logprobs: int | None = None
    prompt_logprobs: int | None = None
    return_token_ids: bool | None = None
    return_tokens_as_token_ids: bool | None = None
    add_special_tokens: bool = False
    truncate_prompt_tokens: int | None = None
    truncation_side: Literal["left", "right"] | None = None
    request_id: str | None = None
    user: str | None = None
    priority: int = 0
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    documents: list[dict[str, str]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    # Checked by the completions rules (refused there until braid implements them).
    use_beam_search: bool = False
    best_of: int | None = None
    response_format: Any = None
    structured_outputs: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    logprob_token_ids: Any = None
    repetition_detection: Any = None


_DECODER = msgspec.json.Decoder(ChatBody)

# Carried over to the completions body by name.
_SHARED = tuple(
    name
    for name in ChatBody.__struct_fields__
    if name in CompletionBody.__struct_fields__ and name not in {"max_tokens", "logprobs", "echo"}
)


@attrs.frozen
class ChatRequest:
    """A validated chat request, its prompts not yet rendered."""

    conversations: tuple[tuple[Message, ...], ...]
    template: TemplateOptions
    body: CompletionBody
    """The sampling fields as a completions body (``prompt`` unset): :func:`braid.request.build_request`
    turns it and the rendered prompts into the engine's request."""
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


def _check_chat(b: ChatBody, *, trust_template: bool) -> None:
    if b.top_logprobs is not None:
        if b.top_logprobs < 0 and b.top_logprobs != -1:
            raise _bad("`top_logprobs` must be a positive value.", "top_logprobs")
        if not b.logprobs:
            raise _bad("when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs")
    if b.tools is not None and not b.tools:
        raise _bad("`tools` cannot be an empty list; leave it out instead.", "tools")
    if b.tool_choice is not None and b.tool_choice != "none":
        if b.tools is None:
            raise _bad("When using `tool_choice`, `tools` must be set.", "tool_choice")
        raise _bad('braid does not parse tool calls: `tool_choice` must be "none".', "tool_choice")
    if b.tools is not None and b.tool_choice is None:
        raise _bad('braid does not parse tool calls: with `tools`, `tool_choice` must be "none".', "tools")
    if b.chat_template is not None and not trust_template:
        raise _bad(
            "Chat template is passed with request, but --trust-request-chat-template is not set. "
            "Refused request with untrusted chat template.",
            "chat_template",
        )


def _conversations(messages: object, batch: bool) -> tuple[tuple[Message, ...], ...]:
    if not batch:
        return (parse_messages(messages),)
    if not isinstance(messages, list) or not messages:
        raise _bad("messages must be a non-empty list of conversations.", "messages")
    return tuple(parse_messages(c, f"messages[{i}]") for i, c in enumerate(messages))


def parse_chat(
    body: bytes, limits: Limits, *, max_model_len: int, batch: bool, trust_template: bool = False
) -> ChatRequest:
    """Decode and validate a chat body, or raise :class:`~braid.errors.InvalidRequest` (a 400).

    ``batch``: the body is for the batch route (``messages`` is a list of conversations).
    """
    b: ChatBody = decode_body(body, _DECODER)
    _check_chat(b, trust_template=trust_template)
    template = TemplateOptions(
        add_generation_prompt=b.add_generation_prompt,
        continue_final_message=b.continue_final_message,
        chat_template=b.chat_template,
        kwargs={**(b.chat_template_kwargs or {}), **({"documents": b.documents} if b.documents else {})},
    )
    max_tokens = b.max_completion_tokens if b.max_completion_tokens is not None else b.max_tokens
    top = b.top_logprobs or 0  # -1: every token of the vocabulary, as for completions
    carried = CompletionBody(
        **{name: getattr(b, name) for name in _SHARED},
        # no limit: the context's room (the plan shrinks it to what each prompt leaves)
        max_tokens=max_model_len if max_tokens is None else max_tokens,
        logprobs=top if b.logprobs else None,
    )
    _check_fields(carried, limits)
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
        logprobs=bool(b.logprobs),
        top_logprobs=top,
        echo=b.echo,
        batch=batch,
    )


__all__ = ["ChatBody", "ChatRequest", "parse_chat"]
