"""Plan: a validated request + the model -> one engine request per prompt, with length checks.

Pure apart from calling the tokenizer (for text prompts not in ``encoded``, and for echoes that
need decoding). The HTTP view tokenizes first, in :mod:`braid.stream.tokenize`, so that a large batch's
texts are encoded off the Trio thread. Any failure here is a 400 for the whole batch, raised
before the response starts. Choice ``k`` of prompt ``i`` has the global index ``i * n + k``.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from braid.engine.base import EngineOutput, EngineRequest, ModelInfo, SamplingParams, Tokenizer, select_model
from braid.errors import InvalidRequest
from braid.wire.completions_request import CompletionRequest, TextPrompt
from braid.wire.output import ResponseMeta


@attrs.frozen
class PlanItem:
    prompt_idx: int
    request: EngineRequest
    echo_text: str
    """The text an echoed choice starts with ("" unless ``echo``)."""


Arrival = tuple[int, EngineOutput]
"""One engine output of the plan's prompt ``prompt_idx``: what the run hands the merger, in order per prompt."""


@attrs.frozen
class Plan:
    meta: ResponseMeta
    items: tuple[PlanItem, ...]
    n: int
    stream: bool
    echo: bool
    hide_completion: bool
    """``echo`` with ``max_tokens=0``: the one token the engine must generate is counted, not shown."""
    logprobs: int | None
    prompt_logprobs: int | None
    include_usage: bool
    continuous_usage: bool
    return_token_ids: bool
    tokens_as_ids: bool
    cached_tokens: bool = False
    """Report ``prompt_tokens_details.cached_tokens`` (the server's ``--enable-prompt-tokens-details``)."""
    priority: int = 0
    """The request's ``priority``: its place in admission's order (braid.stream.admit)."""
    background: bool = False
    """Asked for the background class (``service_tier: "flex"``; braid.stream.admit)."""

    @property
    def num_choices(self) -> int:
        return len(self.items) * self.n

    @property
    def prompt_tokens(self) -> int:
        return sum(len(item.request.prompt_token_ids) for item in self.items)


def _fit(params: SamplingParams, prompt_len: int, limit: int, i: int, req: CompletionRequest) -> SamplingParams:
    """vLLM 0.32's length rule: a prompt longer than the context is refused; otherwise
    ``max_tokens`` shrinks to the room the prompt leaves, and a prompt that leaves no room is
    refused as vLLM refuses it (``max_tokens`` would be 0)."""
    if prompt_len > limit:
        raise InvalidRequest(
            f"This model's maximum context length is {limit} tokens. However, your prompt contains {prompt_len} "
            "input tokens, which exceeds this limit even without any output tokens. Please reduce the length of "
            f"the input prompt. (prompt[{i}])",
            param="input_tokens",
        )
    room = limit - prompt_len
    if room == 0:
        if req.echo and req.max_tokens == 0:
            raise InvalidRequest(
                f"prompt[{i}]: the decoder prompt (length {prompt_len}) plus the number of requested output tokens "
                f"(at least 1) is longer than the maximum model length of {limit}."
            )
        raise InvalidRequest(
            f"max_tokens must be at least 1, got 0 (prompt[{i}] has {prompt_len} tokens and fills the "
            f"context of {limit}).",
            param=req.max_tokens_param,
        )
    if params.max_tokens <= room:
        return params
    if params.min_tokens > room:
        raise InvalidRequest(
            f"min_tokens must be less than or equal to max_tokens={room}, got {params.min_tokens} "
            f"(prompt[{i}] leaves room for {room} tokens)."
        )
    return attrs.evolve(params, max_tokens=room)


def _truncate(ids: tuple[int, ...], keep: int, side: str | None, specials: tuple[int, ...]) -> tuple[int, ...]:
    """``truncate_prompt_tokens`` as vLLM 0.32 applies it: ``truncation_side`` "right" keeps the
    first ``keep`` tokens, "left" (and the default) the last. With no side given, vLLM lets the
    tokenizer truncate a text prompt, and the tokenizer keeps the special tokens it adds and cuts
    the text's own tokens: ``specials`` is what it adds in front (BOS), ``()`` for token prompts."""
    if side == "right":
        return ids[:keep]
    n = len(specials)
    if side is None and 0 < n < keep and ids[:n] == specials:
        return ids[:n] + ids[len(ids) - (keep - n) :]
    return ids[-keep:]


def check_limits(req: CompletionRequest, info: ModelInfo, tokenizer: Tokenizer) -> None:
    """The checks vLLM 0.32 makes before it tokenizes (in this order), or :class:`InvalidRequest`.

    Run by the view before :mod:`braid.stream.tokenize`, so that an over-long text costs no tokenizing,
    and again by :func:`make_plan`. A text of more than ``max_model_len * max_chars_per_token``
    characters cannot fit the context, whatever it encodes to; with ``truncate_prompt_tokens``
    set it is truncated instead, so it is not refused.
    """
    limit = info.max_model_len
    if req.max_tokens > limit:
        raise InvalidRequest(
            f"max_tokens={req.max_tokens} cannot be greater than max_model_len={limit}. "
            "Please request fewer output tokens.",
            param=req.max_tokens_param,
        )
    if req.truncate_prompt_tokens is not None and req.truncate_prompt_tokens > limit:
        raise InvalidRequest(
            f"truncate_prompt_tokens={req.truncate_prompt_tokens} cannot be greater than max_model_len = {limit}. "
            "Please request a smaller truncation size.",
            param="truncate_prompt_tokens",
        )
    if req.truncate_prompt_tokens is None:
        max_chars = limit * tokenizer.max_chars_per_token
        for prompt in req.prompts:
            if isinstance(prompt, TextPrompt) and len(prompt.text) > max_chars:
                raise InvalidRequest(
                    f"This model's maximum context length is {limit} tokens. However, your prompt contains "
                    f"{len(prompt.text)} characters (more than {max_chars} characters, which is the upper bound "
                    f"for {limit} input tokens). Please reduce the length of the input prompt.",
                    param="input_text",
                )


def make_plan(
    req: CompletionRequest,
    info: ModelInfo,
    tokenizer: Tokenizer,
    *,
    request_id: str,
    created: int,
    engine_request_id: str | None = None,
    encoded: Mapping[int, tuple[int, ...]] | None = None,
    cached_tokens: bool = False,
) -> Plan:
    """Tokenize every prompt and check it fits the context, or raise :class:`InvalidRequest`.

    ``request_id`` is the response's ``id``; engine requests are ``{engine_request_id}-{i}``
    (default: the same prefix). It must be unique among running requests: a batch abort names
    engine requests by these ids, and ``request_id`` may be the client's own. ``encoded`` holds
    text prompts' token ids by prompt index (:func:`braid.stream.tokenize.encode_prompts`); a text
    prompt missing from it is encoded here. ``cached_tokens``: the usage reports the prompt tokens
    found in the engine's prefix cache.
    """
    encoded = encoded or {}
    adapter = select_model(info, req.model)  # a LoRA adapter's name selects it (vLLM's 404 otherwise)
    check_limits(req, info, tokenizer)
    engine_prefix = engine_request_id or request_id
    limit = info.max_model_len
    params = req.sampling
    keep = req.truncate_prompt_tokens
    if keep == -1:
        keep = limit - 1  # vLLM: the whole context less one token of room for the output
    specials: tuple[int, ...] | None = None
    items = []
    for i, prompt in enumerate(req.prompts):
        if isinstance(prompt, TextPrompt):
            ids = encoded.get(i)
            if ids is None:
                ids = tuple(tokenizer.encode(prompt.text, add_special_tokens=req.add_special_tokens))
        else:
            ids = prompt.token_ids
        if keep is not None and keep < len(ids):
            text_specials: tuple[int, ...] = ()
            if isinstance(prompt, TextPrompt) and req.add_special_tokens:
                if specials is None:  # what the tokenizer adds to any text, once per request
                    specials = tuple(tokenizer.encode("", add_special_tokens=True))
                text_specials = specials
            ids = _truncate(ids, keep, req.truncation_side, text_specials)
        if not ids:
            raise InvalidRequest(f"prompt[{i}]: the decoder prompt cannot be empty.")
        item_params = _fit(params, len(ids), limit, i, req)
        if not req.echo or req.return_token_ids:
            echo_text = ""  # vLLM echoes "" with return_token_ids
        elif isinstance(prompt, TextPrompt):
            echo_text = prompt.text  # vLLM echoes the text as sent, even when its tokens were truncated
        else:
            # vLLM 0.32's renderer: the ids as sent (before truncation, as a text is echoed as
            # sent), decoded with the special tokens, whatever skip_special_tokens says (that is
            # for the completion): the echo's text_offsets count every token's text.
            echo_text = tokenizer.decode(prompt.token_ids, skip_special_tokens=False)
        text = prompt.text if isinstance(prompt, TextPrompt) else None
        request = EngineRequest(
            f"{engine_prefix}-{i}",
            ids,
            item_params,
            text,
            final_only=not req.stream,
            priority=req.priority,  # vLLM's FCFS scheduler ignores it; --scheduling-policy priority uses it
            lora=adapter,
        )
        items.append(PlanItem(i, request, echo_text))
    return Plan(
        # vLLM's responses name the adapter that generated them
        meta=ResponseMeta(request_id, created, info.name if adapter is None else adapter.name),
        items=tuple(items),
        n=params.n,
        stream=req.stream,
        echo=req.echo,
        hide_completion=req.echo and req.max_tokens == 0,
        logprobs=params.logprobs,
        prompt_logprobs=params.prompt_logprobs,
        include_usage=req.include_usage,
        continuous_usage=req.continuous_usage,
        return_token_ids=req.return_token_ids,
        tokens_as_ids=bool(req.return_tokens_as_token_ids),
        cached_tokens=cached_tokens,
        priority=req.priority,
        background=req.background,
    )
