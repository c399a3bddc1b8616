"""The response bodies braid sends, declared once as msgspec Structs.

:mod:`braid.wire.openapi` generates the response schemas of ``/openapi.json`` from these; the
models and version routes encode through them. The completion bodies, stream events and errors
are written on the hot path by :mod:`braid.wire.completions_response` (hand-built, vLLM's field order); these
Structs describe exactly those bytes, and the tests decode real responses through them with
unknown fields forbidden, so a field added to one and not the other fails a test.

Every field is nullable where vLLM's is, and fields that braid always sends as ``null`` (vLLM
fields braid has nothing to put in) are typed ``None``.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec


class _Strict(msgspec.Struct, forbid_unknown_fields=True):
    """Unknown fields are an error when a test decodes a response, and ``additionalProperties:
    false`` in the schema."""


class Logprobs(_Strict):
    """OpenAI's legacy logprobs: one entry per token in each list."""

    text_offset: list[int]
    token_logprobs: list[float | None]
    tokens: list[str]
    top_logprobs: list[dict[str, float] | None]


class PromptLogprob(_Strict):
    logprob: float
    rank: int | None
    decoded_token: str


class PromptTokensDetails(_Strict):
    cached_tokens: int
    # In a non-streamed body only (vLLM's final usage event drops them).
    created_cache_tokens: None = None
    multimodal_tokens: None = None


class CompletionTokensDetails(_Strict):
    reasoning_tokens: int


class Usage(_Strict):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None
    """Absent in a stream; null in a body unless ``--prompt-tokens-details`` is on."""
    completion_tokens_details: CompletionTokensDetails | None = None
    """Through ``--reasoning-parser`` (chat): how many completion tokens were reasoning."""


class CompletionChoice(_Strict):
    index: int
    text: str
    logprobs: Logprobs | None
    finish_reason: str | None
    stop_reason: str | int | None
    token_ids: list[int] | None
    prompt_logprobs: list[dict[str, PromptLogprob] | None] | None
    prompt_token_ids: list[int] | None
    routed_experts: None


class Completion(_Strict):
    """The body of a non-streamed completion."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    service_tier: None
    system_fingerprint: None
    usage: Usage
    kv_transfer_params: dict[str, Any] | None  # the engine's KV connector's, when it has one
    ec_transfer_params: None
    metrics: None


class CompletionChunkChoice(_Strict):
    index: int
    text: str
    logprobs: Logprobs | None
    finish_reason: str | None
    stop_reason: str | int | None
    prompt_token_ids: list[int] | None
    token_ids: list[int] | None


class CompletionChunk(_Strict):
    """One ``data:`` event of a stream. The last event before ``data: [DONE]`` may carry the
    usage alone, with no choices (``stream_options.include_usage``)."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChunkChoice]
    usage: Usage | msgspec.UnsetType = msgspec.UNSET
    """On every event with ``continuous_usage_stats``, else on the last one only or not at all."""


class ChatTopLogprob(_Strict):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatLogprobEntry(_Strict):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[ChatTopLogprob]


class ChatLogprobs(_Strict):
    content: list[ChatLogprobEntry]


class ToolCallFunction(_Strict):
    name: str
    arguments: str
    """The JSON text of the arguments, as the model wrote it."""


class ToolCall(_Strict):
    """A whole call in a message (through ``--tool-call-parser``)."""

    id: str
    type: Literal["function"]
    function: ToolCallFunction


class ToolCallPieceFunction(_Strict):
    arguments: str
    name: str | None | msgspec.UnsetType = msgspec.UNSET


class ToolCallPiece(_Strict):
    """A piece of a streamed call: the first carries its id, type and name; the later ones only
    the next fragment of its arguments."""

    index: int
    function: ToolCallPieceFunction
    id: str | None | msgspec.UnsetType = msgspec.UNSET
    type: Literal["function"] | msgspec.UnsetType = msgspec.UNSET


class ChatMessage(_Strict):
    role: str
    content: str | None
    """Null when the output was only tool calls (or only reasoning)."""
    refusal: None
    annotations: None
    audio: None
    function_call: None
    reasoning: str | None
    """The model's reasoning, through ``--reasoning-parser`` (null without one, or when hidden)."""
    tool_calls: list[ToolCall] | msgspec.UnsetType = msgspec.UNSET


class ChatChoice(_Strict):
    index: int
    message: ChatMessage
    logprobs: ChatLogprobs | None
    finish_reason: str
    stop_reason: str | int | None
    token_ids: list[int] | None
    routed_experts: None


class ChatCompletion(_Strict):
    """A non-streamed ``/v1/chat/completions`` (or batch) answer."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    service_tier: None
    system_fingerprint: None
    usage: Usage
    prompt_logprobs: list[dict[str, PromptLogprob] | None] | None
    prompt_token_ids: list[int] | None
    prompt_text: None
    kv_transfer_params: dict[str, Any] | None  # the engine's KV connector's, when it has one
    ec_transfer_params: None
    metrics: None


class ChatDelta(_Strict):
    """A role chunk's ``{role, content: ""}``, or what a content chunk adds: its text, or through
    parsers its content, reasoning and call pieces (each only when it has some; ``{}`` on a
    finishing chunk that adds nothing)."""

    content: str | msgspec.UnsetType = msgspec.UNSET
    role: str | msgspec.UnsetType = msgspec.UNSET
    reasoning: str | None | msgspec.UnsetType = msgspec.UNSET
    tool_calls: list[ToolCallPiece] | msgspec.UnsetType = msgspec.UNSET


class ChatChunkChoice(_Strict):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None
    finish_reason: str | None
    token_ids: list[int] | None | msgspec.UnsetType = msgspec.UNSET
    stop_reason: str | int | None | msgspec.UnsetType = msgspec.UNSET


class ChatChunk(_Strict):
    """One event of a chat stream: a role chunk, a content chunk, or the usage chunk (no choices)."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | msgspec.UnsetType = msgspec.UNSET
    prompt_token_ids: list[int] | None | msgspec.UnsetType = msgspec.UNSET
    prompt_text: None | msgspec.UnsetType = msgspec.UNSET


class ErrorDetail(_Strict):
    message: str
    type: str
    """vLLM's name for the class of error, e.g. ``BadRequestError``."""
    param: str | None
    """The offending request field, when there is one."""
    code: int
    """The HTTP status."""


class Error(_Strict):
    """Every error, as a JSON body and as a stream's last ``data:`` event before ``[DONE]``."""

    error: ErrorDetail


class ModelCard(_Strict):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: str
    parent: str | None  # a LoRA adapter's base model (vLLM's served name of it); None for the model
    max_model_len: int | None  # None for a LoRA adapter, as vLLM lists them
    permission: list[dict[str, Any]]  # not `object`: the field above shadows it here


class ModelList(_Strict):
    object: Literal["list"]
    data: list[ModelCard]


class Version(_Strict):
    """``GET /version``: vLLM's shape (``version``, which vLLM's clients read) and braid's own.
    ``version`` is the version of vLLM that runs the model, as ``vllm serve`` reports it (so a
    client that checks for a vLLM feature by version gets the engine's), or braid's own on an
    engine that is not vLLM; ``braid_version`` is always braid's."""

    version: str
    braid_version: str


class Tokenize(_Strict):
    """``POST /tokenize``'s answer, in vLLM's field order."""

    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None
    """Each token as the vocabulary spells it, with ``return_token_strs``; else null."""


class Detokenize(_Strict):
    """``POST /detokenize``'s answer: the ids decoded, special tokens spelled out."""

    prompt: str


__all__ = [
    "ChatChoice",
    "ChatChunk",
    "ChatChunkChoice",
    "ChatCompletion",
    "ChatDelta",
    "ChatLogprobEntry",
    "ChatLogprobs",
    "ChatMessage",
    "ChatTopLogprob",
    "Completion",
    "CompletionChoice",
    "CompletionChunk",
    "CompletionChunkChoice",
    "Detokenize",
    "Error",
    "ErrorDetail",
    "Logprobs",
    "ModelCard",
    "ModelList",
    "PromptLogprob",
    "PromptTokensDetails",
    "Tokenize",
    "Usage",
    "Version",
]
