"""Render: engine deltas -> OpenAI choice fragments (echo, logprobs, text offsets, token counts).

Pure. One :class:`ChoiceRenderer` per request keeps what each choice has emitted so far, so that a
stream's fragments and a non-streaming response are the same function of the engine's outputs:
the non-streaming text of a choice is the concatenation of its streamed fragments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from braid.engine.base import EngineOutput, Tokenizer, TopLogprobs
from braid.engine.tool_calls import ParsedDelta, ParsedOutput
from braid.stream.parse import ChoiceParsing
from braid.stream.plan import Plan
from braid.wire.output import ChatLogprobs, ChoiceChunk, LogprobsFragment

_FLOOR = -9999.0  # vLLM clamps -inf (and anything below) so JSON stays finite


@attrs.define
class _ChoiceState:
    started: bool = False
    offset: int = 0
    """The next token's ``text_offset``: offsets add up token strings, in both modes."""
    tokens: int = 0
    finished: bool = False


def render_logprobs(
    token_ids: Sequence[int],
    steps: Sequence[TopLogprobs | None],
    *,
    top: int,
    offset: int,
    tokenizer: Tokenizer,
    as_ids: bool,
) -> LogprobsFragment:
    """OpenAI's legacy logprobs object for ``token_ids`` (``steps[j]`` holds position ``j``).

    A position without a step dict (the first prompt token) has a null logprob and null top
    logprobs. ``top_logprobs`` keeps the first ``top + 1`` entries (the actual token first), as vLLM.
    """
    tokens: list[str] = []
    token_lps: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    for j, t in enumerate(token_ids):
        d = steps[j] if j < len(steps) else None
        if d is None or t not in d:
            name = f"token_id:{t}" if as_ids else tokenizer.token_text(t)
            token_lps.append(None)
            tops.append(None)
        else:
            name = f"token_id:{t}" if as_ids else d[t].decoded_token
            token_lps.append(max(d[t].logprob, _FLOOR))
            entries: dict[str, float] = {}
            for rank, (tok, lp) in enumerate(d.items()):
                if rank > top:
                    break
                entries[f"token_id:{tok}" if as_ids else lp.decoded_token] = max(lp.logprob, _FLOOR)
            tops.append(entries)
        tokens.append(name)
        offsets.append(offset)
        offset += len(name)
    return LogprobsFragment(tuple(offsets), tuple(token_lps), tuple(tokens), tuple(tops))


def _chat_entry(token: str, logprob: float, decoded: str | None) -> dict[str, object]:
    return {
        "token": token,
        "logprob": max(logprob, _FLOOR),
        "bytes": None if decoded is None else list(decoded.encode("utf-8", errors="replace")),
    }


def render_chat_logprobs(
    token_ids: Sequence[int],
    steps: Sequence[TopLogprobs | None],
    *,
    top: int,
    tokenizer: Tokenizer,
    as_ids: bool,
) -> ChatLogprobs:
    """Chat's logprobs ``content`` entries for ``token_ids``, as vLLM's chat server writes them:
    ``top_logprobs`` lists the first ``top`` entries of the position's dict (all for -1), which
    holds the sampled token first."""
    out: list[dict[str, object]] = []
    for j, t in enumerate(token_ids):
        d = steps[j] if j < len(steps) else None
        if d is None or t not in d:
            text = f"token_id:{t}" if as_ids else tokenizer.decode([t], skip_special_tokens=False)
            out.append(
                {
                    "token": text,
                    "logprob": _FLOOR,
                    "bytes": list(text.encode("utf-8", errors="replace")),
                    "top_logprobs": [],
                }
            )
            continue
        lp = d[t]
        entry = _chat_entry(f"token_id:{t}" if as_ids else lp.decoded_token, lp.logprob, lp.decoded_token)
        alts = []
        for rank, (tok, alt) in enumerate(d.items()):
            if top != -1 and rank >= top:
                break
            name = f"token_id:{tok}" if as_ids else alt.decoded_token
            alts.append(
                {
                    "token": name,
                    "logprob": max(alt.logprob, _FLOOR),
                    "bytes": list(name.encode("utf-8", errors="replace")),
                }
            )
        entry["top_logprobs"] = alts
        out.append(entry)
    return tuple(out)


def render_prompt_logprobs(
    steps: Sequence[TopLogprobs | None],
) -> tuple[dict[str, dict[str, object]] | None, ...]:
    """vLLM's raw ``prompt_logprobs`` field: per position ``{token_id: {logprob, rank, decoded_token}}``."""
    return tuple(
        None
        if d is None
        else {
            str(t): {"logprob": max(lp.logprob, _FLOOR), "rank": lp.rank, "decoded_token": lp.decoded_token}
            for t, lp in d.items()
        }
        for d in steps
    )


@attrs.define
class ChoiceRenderer:
    """Turns each prompt's engine outputs into :class:`ChoiceChunk` s, one per choice delta."""

    plan: Plan
    tokenizer: Tokenizer
    chat_top: int | None = None
    """Chat: logprobs in chat's shape, this many alternatives per token (None: completions')."""
    parsing: ChoiceParsing | None = None
    """Chat with tools or reasoning: the choices' parsers (:mod:`braid.stream.parse`)."""
    _choices: list[_ChoiceState] = attrs.field(init=False)
    _prompt_steps: list[tuple[TopLogprobs | None, ...] | None] = attrs.field(init=False)
    _cached: dict[int, int] = attrs.field(init=False, factory=dict)  # by prompt: its first report
    _kv_transfer: Mapping[str, Any] | None = attrs.field(init=False, default=None)
    _unfinished: int = attrs.field(init=False)  # choices without their finish_reason yet

    def __attrs_post_init__(self) -> None:
        self._choices = [_ChoiceState() for _ in range(self.plan.num_choices)]
        self._unfinished = self.plan.num_choices
        self._prompt_steps = [None] * len(self.plan.items)

    @property
    def cached_tokens(self) -> int | None:
        """Prompt tokens served from the engine's prefix cache, summed over the prompts; None if
        the plan does not report them (``Plan.cached_tokens``) or no output reported any, as vLLM
        leaves the details out then.

        Counted once per prompt, like ``prompt_tokens``: the first value reported for it. With
        ``n > 1`` vLLM reports per choice, and a later choice finds the prompt's blocks cached by
        the first; a stream takes the first choice's report, a non-streamed body the one vLLM
        puts on the prompt's single final output (its last choice's), so the two can differ.
        """
        return sum(self._cached.values()) if self._cached else None

    @property
    def kv_transfer_params(self) -> Mapping[str, Any] | None:
        """The first prompt's KV connector parameters, from its finished output (what vLLM puts in
        a non-streamed body: ``final_res_batch[0].kv_transfer_params``); None without a connector."""
        return self._kv_transfer

    @property
    def reasoning_tokens(self) -> int | None:
        """Reasoning tokens over every choice, when the server counts them (a reasoning parser)."""
        return None if self.parsing is None else self.parsing.reasoning_tokens

    @property
    def completion_tokens(self) -> int:
        return sum(c.tokens for c in self._choices)

    @property
    def all_finished(self) -> bool:
        return self._unfinished == 0  # asked after every chunk of a stream: counted, not scanned

    def render(self, prompt_idx: int, output: EngineOutput) -> list[ChoiceChunk]:
        plan = self.plan
        if output.prompt_logprobs is not None:
            self._prompt_steps[prompt_idx] = output.prompt_logprobs
        if plan.cached_tokens and output.num_cached_tokens is not None and prompt_idx not in self._cached:
            self._cached[prompt_idx] = output.num_cached_tokens  # off by default: nothing per output
        if prompt_idx == 0 and output.kv_transfer_params is not None:
            self._kv_transfer = output.kv_transfer_params
        prompt_ids = output.prompt_token_ids
        chunks = []
        for delta in output.choices:
            index = prompt_idx * plan.n + delta.index
            state = self._choices[index]
            if state.finished:
                raise ValueError(f"choice {index} got a delta after it finished")
            first = not state.started
            ids: tuple[int, ...]
            steps: tuple[TopLogprobs | None, ...]
            if plan.hide_completion:
                text, ids, steps = "", (), ()
            else:
                text, ids, steps = delta.text, delta.token_ids, delta.logprobs or ()
            if first and plan.echo:
                prompt_steps = self._prompt_steps[prompt_idx] or ()
                text = self.plan.items[prompt_idx].echo_text + text
                steps = (*prompt_steps, *((None,) * (len(prompt_ids) - len(prompt_steps))), *steps)
                ids = (*prompt_ids, *ids)
            state.tokens += len(delta.token_ids)
            finish_reason = delta.finish_reason
            if finish_reason is not None:
                state.finished = True
                self._unfinished -= 1
            elif not text and not delta.token_ids and not (first and plan.echo):
                continue  # nothing to show yet (vLLM skips such deltas too)
            parsed: ParsedDelta | None = None
            whole: ParsedOutput | None = None
            parsing = self.parsing
            # Reasoning hidden (include_reasoning false): so are the tokens' logprobs and ids,
            # which would spell it out (as vLLM's server hides them).
            hidden = parsing is not None and not parsing.options.include_reasoning
            if parsing is not None:
                if parsing.stream:
                    parsed = parsing.take(index, finished=finish_reason is not None)
                    if (
                        parsed.empty
                        and finish_reason is None
                        and (plan.logprobs is None or hidden)
                        and (not plan.return_token_ids or hidden)
                    ):
                        continue  # the parser holds it back (a marker, a partial call): vLLM sends nothing
                else:
                    parsing.gather(index, delta.text, delta.token_ids)
                    if finish_reason is not None:
                        whole = parsing.whole(index)
                if finish_reason is not None:
                    finish_reason = parsing.finish_reason(index, finish_reason)
            state.started = True
            logprobs: LogprobsFragment | ChatLogprobs | None = None
            if hidden:
                pass
            elif plan.logprobs is not None and self.chat_top is not None:
                logprobs = render_chat_logprobs(
                    ids, steps, top=self.chat_top, tokenizer=self.tokenizer, as_ids=plan.tokens_as_ids
                )
            elif plan.logprobs is not None:
                fragment = render_logprobs(
                    ids,
                    steps,
                    top=plan.logprobs,
                    offset=state.offset,
                    tokenizer=self.tokenizer,
                    as_ids=plan.tokens_as_ids,
                )
                if fragment.tokens:
                    state.offset = fragment.text_offset[-1] + len(fragment.tokens[-1])
                logprobs = fragment
            prompt_lps = None
            if first and plan.prompt_logprobs is not None and not plan.stream:
                prompt_lps = render_prompt_logprobs(self._prompt_steps[prompt_idx] or ())
            chunks.append(
                ChoiceChunk(
                    index=index,
                    prompt_idx=prompt_idx,
                    text=text,
                    logprobs=logprobs,
                    finish_reason=finish_reason,
                    stop_reason=delta.stop_reason,
                    token_ids=delta.token_ids if plan.return_token_ids and not hidden else None,
                    # vLLM's streams carry the prompt ids on an echoing first chunk even
                    # without return_token_ids (its non-streamed bodies do not)
                    prompt_token_ids=prompt_ids
                    if first and (plan.return_token_ids or (plan.echo and plan.stream))
                    else None,
                    prompt_logprobs=prompt_lps,
                    completion_tokens=state.tokens,
                    parsed=parsed,
                    whole=whole,
                    reasoning_tokens=parsing.reasoning_so_far(index)
                    if parsing is not None and parsing.stream and plan.continuous_usage
                    else None,
                )
            )
        return chunks
