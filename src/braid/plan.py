"""Plan: a validated request + the model -> one engine request per prompt, with length checks.

Pure apart from calling the tokenizer. Any failure here is a 400 for the whole batch, raised
before the response starts. Choice ``k`` of prompt ``i`` has the global index ``i * n + k``.
"""

from __future__ import annotations

import attrs

from braid.engine.base import EngineRequest, ModelInfo, SamplingParams, Tokenizer
from braid.errors import InvalidRequest
from braid.request import CompletionRequest, TextPrompt


@attrs.frozen
class PlanItem:
    prompt_idx: int
    request: EngineRequest
    echo_text: str
    """The text an echoed choice starts with ("" unless ``echo``)."""


@attrs.frozen
class ResponseMeta:
    id: str
    created: int
    model: str


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

    @property
    def num_choices(self) -> int:
        return len(self.items) * self.n

    @property
    def prompt_tokens(self) -> int:
        return sum(len(item.request.prompt_token_ids) for item in self.items)


def _sampling_params(req: CompletionRequest, max_tokens: int) -> SamplingParams:
    return SamplingParams(
        max_tokens=max_tokens,
        n=req.n,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        min_p=req.min_p,
        seed=req.seed,
        stop=req.stop,
        stop_token_ids=req.stop_token_ids,
        include_stop_str_in_output=req.include_stop_str_in_output,
        ignore_eos=req.ignore_eos,
        min_tokens=req.min_tokens,
        logprobs=req.logprobs,
        prompt_logprobs=req.prompt_logprobs,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        repetition_penalty=req.repetition_penalty,
        skip_special_tokens=req.skip_special_tokens,
        spaces_between_special_tokens=req.spaces_between_special_tokens,
        logit_bias=req.logit_bias,
        allowed_token_ids=req.allowed_token_ids,
        bad_words=req.bad_words,
    )


def make_plan(
    req: CompletionRequest, info: ModelInfo, tokenizer: Tokenizer, *, request_id: str, created: int
) -> Plan:
    """Tokenize every prompt and check it fits the context, or raise :class:`InvalidRequest`."""
    limit = info.max_model_len
    if req.max_tokens > limit:
        raise InvalidRequest(
            f"max_tokens={req.max_tokens} cannot be greater than max_model_len={limit}. "
            "Please request fewer output tokens.",
            param="max_tokens",
        )
    engine_max_tokens = max(req.max_tokens, 1)  # echo with max_tokens=0 still generates one token
    params = _sampling_params(req, engine_max_tokens)
    room = limit - engine_max_tokens
    items = []
    for i, prompt in enumerate(req.prompts):
        if isinstance(prompt, TextPrompt):
            ids = tuple(tokenizer.encode(prompt.text, add_special_tokens=req.add_special_tokens))
        else:
            ids = prompt.token_ids
        if req.truncate_prompt_tokens is not None:
            keep = room if req.truncate_prompt_tokens == -1 else req.truncate_prompt_tokens
            if keep > room:
                raise InvalidRequest(
                    f"truncate_prompt_tokens={keep} is more than the {room} prompt tokens the context leaves.",
                    param="truncate_prompt_tokens",
                )
            ids = ids[-keep:] if keep > 0 else ()
        if not ids:
            raise InvalidRequest(f"prompt[{i}]: the decoder prompt cannot be empty.", param="prompt")
        if len(ids) > room:
            raise InvalidRequest(
                f"You passed {len(ids)} input tokens and requested {req.max_tokens} output tokens. However, the "
                f"model's context length is only {limit} tokens, resulting in a maximum input length of "
                f"{room} tokens. Please reduce the length of the input prompt. (prompt[{i}])",
                param="input_tokens",
            )
        if not req.echo or req.return_token_ids:
            echo_text = ""  # vLLM echoes "" with return_token_ids
        elif isinstance(prompt, TextPrompt) and req.truncate_prompt_tokens is None:
            echo_text = prompt.text
        else:
            echo_text = tokenizer.decode(ids, skip_special_tokens=req.skip_special_tokens)
        text = prompt.text if isinstance(prompt, TextPrompt) else None
        items.append(PlanItem(i, EngineRequest(f"{request_id}-{i}", ids, params, text), echo_text))
    return Plan(
        meta=ResponseMeta(request_id, created, info.name),
        items=tuple(items),
        n=req.n,
        stream=req.stream,
        echo=req.echo,
        hide_completion=req.echo and req.max_tokens == 0,
        logprobs=req.logprobs,
        prompt_logprobs=req.prompt_logprobs,
        include_usage=req.include_usage,
        continuous_usage=req.continuous_usage,
        return_token_ids=req.return_token_ids,
        tokens_as_ids=req.return_tokens_as_token_ids,
    )
