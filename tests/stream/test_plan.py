"""make_plan with the scripted engine's model and byte tokenizer (BOS=0, byte b -> b+3)."""

from __future__ import annotations

import json

import attrs
import pytest

from braid.engine.base import LoraAdapter, ModelInfo
from braid.engine.scripted import BOS, EOS, VOCAB_SIZE, ByteTokenizer, ScriptedEngine
from braid.errors import InvalidRequest, ModelNotFound
from braid.stream.plan import Plan, make_plan
from braid.wire.completions_request import parse_request
from braid.wire.fields import Limits

TOK = ByteTokenizer()
INFO = ScriptedEngine().info
SMALL = ModelInfo(name="small", root="braid/small", max_model_len=32, vocab_size=VOCAB_SIZE)


def ids_of(text: str) -> tuple[int, ...]:
    return tuple(b + 3 for b in text.encode())


def plan(info: ModelInfo = INFO, request_id: str = "cmpl-abc", created: int = 1234, **body: object) -> Plan:
    return plan_of(body, info, request_id, created)


def plan_of(body: dict[str, object], info: ModelInfo = INFO, request_id: str = "cmpl-abc", created: int = 1234) -> Plan:
    body.setdefault("prompt", "hello")
    req = parse_request(json.dumps(body).encode(), Limits(vocab_size=info.vocab_size))
    return make_plan(req, info, TOK, request_id=request_id, created=created)


def refuse(info: ModelInfo = INFO, **body: object) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as exc:
        plan_of(body, info)
    assert exc.value.status == 400
    return exc.value


def test_only_non_streaming_requests_ask_for_the_final_output_only() -> None:
    assert all(it.request.final_only for it in plan(prompt=["a", "b"]).items)
    assert not any(it.request.final_only for it in plan(prompt=["a", "b"], stream=True).items)


def test_one_engine_request_per_prompt_with_suffixed_ids() -> None:
    p = plan(request_id="cmpl-xyz", created=99, prompt=["a", "b", "c"], n=2)
    assert [it.request.request_id for it in p.items] == ["cmpl-xyz-0", "cmpl-xyz-1", "cmpl-xyz-2"]
    assert [it.prompt_idx for it in p.items] == [0, 1, 2]
    assert (p.meta.id, p.meta.created, p.meta.model) == ("cmpl-xyz", 99, INFO.name)
    assert p.n == 2 and p.num_choices == 6
    assert all(it.request.params.n == 2 for it in p.items)


def test_priority_orders_admission_and_reaches_the_engine() -> None:
    p = plan(prompt=["a", "b"], priority=-3)
    assert p.priority == -3  # admission's order (routes.common.open_run gives it to the ticket)
    assert [it.request.priority for it in p.items] == [-3, -3]  # vLLM uses it with --scheduling-policy priority
    assert plan().priority == 0


def test_model_selects_a_lora_adapter_for_every_prompt_and_names_the_response() -> None:
    adapter = LoraAdapter("tuned", 1, "/adapters/tuned", INFO.name)
    info = attrs.evolve(INFO, adapters=(adapter,))
    tuned = plan(info, model="tuned", prompt=["a", "b"])
    assert [it.request.lora for it in tuned.items] == [adapter, adapter]
    assert tuned.meta.model == "tuned"  # vLLM's responses name the adapter
    for base in (plan(info, model=INFO.name), plan(info)):
        assert [it.request.lora for it in base.items] == [None] and base.meta.model == INFO.name
    with pytest.raises(ModelNotFound):
        plan(INFO, model="tuned")  # served without adapters


def test_engine_ids_can_have_their_own_prefix() -> None:
    req = parse_request(
        json.dumps({"prompt": ["a", "b"], "max_tokens": 4}).encode(), Limits(vocab_size=INFO.vocab_size)
    )
    p = make_plan(req, INFO, TOK, request_id="cmpl-client", created=1, engine_request_id="cmpl-client-1a2b")
    assert p.meta.id == "cmpl-client"
    assert [it.request.request_id for it in p.items] == ["cmpl-client-1a2b-0", "cmpl-client-1a2b-1"]


def test_text_prompts_get_bos_and_keep_their_text() -> None:
    p = plan(prompt=["hi", "abc"])
    assert [it.request.prompt_token_ids for it in p.items] == [(BOS, *ids_of("hi")), (BOS, *ids_of("abc"))]
    assert [it.request.prompt_text for it in p.items] == ["hi", "abc"]


def test_text_prompts_encoded_in_advance_are_not_encoded_again() -> None:
    req = parse_request(json.dumps({"prompt": ["hi", "abc"]}).encode(), Limits(vocab_size=VOCAB_SIZE))
    p = make_plan(req, INFO, TOK, request_id="cmpl-x", created=0, encoded={1: (7, 8)})
    assert [it.request.prompt_token_ids for it in p.items] == [(BOS, *ids_of("hi")), (7, 8)]
    assert [it.request.prompt_text for it in p.items] == ["hi", "abc"]


def test_add_special_tokens_false_leaves_out_bos() -> None:
    assert plan(prompt="hi", add_special_tokens=False).items[0].request.prompt_token_ids == ids_of("hi")


def test_token_prompts_are_kept_as_given() -> None:
    p = plan(prompt=[[5, 6, 7], [0, 200], [9]])
    assert [it.request.prompt_token_ids for it in p.items] == [(5, 6, 7), (0, 200), (9,)]
    assert all(it.request.prompt_text is None for it in p.items)
    assert plan(prompt=[10, 11]).items[0].request.prompt_token_ids == (10, 11)


def test_empty_text_prompt_without_bos_is_refused() -> None:
    err = refuse(prompt=["x", ""], add_special_tokens=False)
    assert (err.type, err.param) == ("BadRequestError", None)
    assert err.message == "prompt[1]: the decoder prompt cannot be empty."
    assert plan(prompt=["x", ""]).items[1].request.prompt_token_ids == (BOS,)


def test_sampling_params_carry_the_request() -> None:
    p = plan(
        max_tokens=7, temperature=0.5, top_p=0.9, seed=3, stop=["zz"], stop_token_ids=[9], logprobs=2, ignore_eos=True
    )
    sp = p.items[0].request.params
    assert (
        sp.max_tokens,
        sp.temperature,
        sp.passthrough.top_p,
        sp.seed,
        sp.stop,
        sp.stop_token_ids,
        sp.logprobs,
        sp.ignore_eos,
    ) == (
        7,
        0.5,
        0.9,
        3,
        ("zz",),
        (9,),
        2,
        True,
    )
    assert plan().items[0].request.params.max_tokens == 16  # the default


def test_max_tokens_over_max_model_len_is_400_max_tokens() -> None:
    err = refuse(SMALL, prompt="a", max_tokens=33)
    assert err.param == "max_tokens"
    assert "33" in err.message and "32" in err.message


# vLLM 0.32's length rule (SMALL: max_model_len 32). A prompt longer than the context is
# refused; one that fills it exactly leaves max_tokens 0 and is refused; any other prompt is
# accepted and its engine max_tokens shrinks to the room it leaves, per prompt.


def max_tokens_of(p: Plan) -> list[int]:
    return [it.request.params.max_tokens for it in p.items]


def test_prompt_longer_than_the_context_is_400_input_tokens() -> None:
    err = refuse(SMALL, prompt=["ok", "x" * 32], max_tokens=12)  # 33 tokens with BOS
    assert (err.type, err.param) == ("BadRequestError", "input_tokens")
    assert err.message == (
        "This model's maximum context length is 32 tokens. However, your prompt contains 33 input tokens, "
        "which exceeds this limit even without any output tokens. Please reduce the length of the input "
        "prompt. (prompt[1])"
    )


def test_token_prompt_longer_than_the_context_is_400_input_tokens() -> None:
    err = refuse(SMALL, prompt=[[5] * 33], max_tokens=1)
    assert (err.param, err.message.endswith("(prompt[0])")) == ("input_tokens", True)
    assert "your prompt contains 33 input tokens" in err.message
    assert refuse(SMALL, prompt=[5] * 33, max_tokens=1).param == "input_tokens"  # a flat token list
    assert refuse(SMALL, prompt=[[5] * 33], echo=True, max_tokens=0).param == "input_tokens"


@pytest.mark.parametrize("prompt", ["x" * 31, [[5] * 32], [5] * 32], ids=["text", "token-list", "flat"])
def test_prompt_that_fills_the_context_is_400_max_tokens(prompt: object) -> None:
    err = refuse(SMALL, prompt=prompt, max_tokens=16)
    assert (err.type, err.param) == ("BadRequestError", "max_tokens")
    assert err.message == "max_tokens must be at least 1, got 0 (prompt[0] has 32 tokens and fills the context of 32)."
    assert refuse(SMALL, prompt=prompt, max_tokens=1).param == "max_tokens"
    assert refuse(SMALL, prompt=prompt, echo=True, max_tokens=5).param == "max_tokens"  # echo alone changes nothing


def test_echo_with_zero_max_tokens_and_a_prompt_that_fills_the_context_is_400_without_param() -> None:
    err = refuse(SMALL, prompt=["a", "x" * 31], echo=True, max_tokens=0)
    assert (err.type, err.param) == ("BadRequestError", None)
    assert err.message == (
        "prompt[1]: the decoder prompt (length 32) plus the number of requested output tokens (at least 1) "
        "is longer than the maximum model length of 32."
    )


def test_a_prompt_that_leaves_less_room_than_max_tokens_gets_max_tokens_shrunk() -> None:
    p = plan(SMALL, prompt=["ok", "x" * 28, "x" * 30], max_tokens=16)  # 3, 29 and 31 tokens with BOS
    assert [len(it.request.prompt_token_ids) for it in p.items] == [3, 29, 31]
    assert max_tokens_of(p) == [16, 3, 1]
    # only max_tokens changes: the rest of the sampling params are the request's
    first, second, third = (it.request.params for it in p.items)
    assert attrs.evolve(second, max_tokens=16) == first == attrs.evolve(third, max_tokens=16)
    assert p.prompt_tokens == 3 + 29 + 31


def test_shrinking_is_per_prompt_and_leaves_prompts_that_fit_alone() -> None:
    p = plan(SMALL, prompt=[[5] * 20, [6] * 10, [7] * 28], max_tokens=12, n=2)
    assert max_tokens_of(p) == [12, 12, 4]
    assert [it.request.params.n for it in p.items] == [2, 2, 2]
    assert max_tokens_of(plan(SMALL, prompt=[[5] * 16], max_tokens=16)) == [16]  # exactly fits: unchanged
    assert max_tokens_of(plan(SMALL, prompt=[[5] * 17], max_tokens=16)) == [15]


def test_default_max_tokens_shrinks_too() -> None:
    assert max_tokens_of(plan(SMALL, prompt="x" * 25)) == [6]  # 26 tokens; default 16


def test_max_tokens_equal_to_max_model_len_is_accepted_and_shrunk() -> None:
    assert max_tokens_of(plan(SMALL, prompt=[5], max_tokens=32)) == [31]
    assert max_tokens_of(plan(SMALL, prompt="a", max_tokens=32)) == [30]


@pytest.mark.parametrize(
    ("prompt", "echo_text"),
    [
        ("hi there", "hi there"),
        ([[*ids_of("abc")]], "abc"),
        ([BOS, *ids_of("yo")], "<s>yo"),  # special tokens are echoed, as vLLM's renderer decodes the ids
        ([BOS, BOS, BOS, BOS, BOS], "<s><s><s><s><s>"),
    ],
)
def test_echo_text(prompt: object, echo_text: str) -> None:
    p = plan(prompt=prompt, echo=True)
    assert p.echo and p.items[0].echo_text == echo_text
    assert plan(prompt=prompt).items[0].echo_text == ""


@pytest.mark.parametrize("skip", [True, False])
def test_the_echo_of_token_ids_keeps_special_tokens_whatever_skip_special_tokens_says(skip: bool) -> None:
    """vLLM decodes a token prompt for its echo with special tokens; ``skip_special_tokens`` is
    the completion's. The echo's text then holds every token's text, as its text_offsets count."""
    ids = [BOS, *ids_of("yo"), EOS, *ids_of("!")]
    p = plan(prompt=ids, echo=True, skip_special_tokens=skip)
    assert p.items[0].echo_text == "<s>yo</s>!" == "".join(TOK.token_text(t) for t in ids)
    assert p.items[0].request.params.passthrough.skip_special_tokens is skip  # the completion's, unchanged


def test_a_truncated_token_prompt_is_echoed_whole_as_sent() -> None:
    """vLLM's renderer decodes the ids before it truncates them (a text is echoed as sent too)."""
    p = plan(prompt=[*ids_of("abcd")], echo=True, truncate_prompt_tokens=2)
    assert p.items[0].request.prompt_token_ids == ids_of("cd")
    assert p.items[0].echo_text == "abcd"


def test_echo_text_is_empty_with_return_token_ids() -> None:
    assert plan(prompt="hi", echo=True, return_token_ids=True).items[0].echo_text == ""


def test_echo_text_per_prompt_in_a_batch() -> None:
    p = plan(prompt=["one", "two"], echo=True)
    assert [it.echo_text for it in p.items] == ["one", "two"]


def test_echo_with_zero_max_tokens_generates_one_hidden_token() -> None:
    p = plan(prompt="hi", echo=True, max_tokens=0)
    assert p.hide_completion
    assert p.items[0].request.params.max_tokens == 1
    assert not plan(prompt="hi", echo=True, max_tokens=1).hide_completion
    assert not plan(prompt="hi", max_tokens=1).hide_completion


def test_echo_with_zero_max_tokens_still_needs_room_for_one_token() -> None:
    p = plan(SMALL, prompt=[[5] * 31], echo=True, max_tokens=0)
    assert max_tokens_of(p) == [1] and p.hide_completion
    err = refuse(SMALL, prompt=[[5] * 32], echo=True, max_tokens=0)
    assert (err.type, err.param) == ("BadRequestError", None)
    assert "the decoder prompt (length 32)" in err.message


def test_truncate_prompt_tokens_keeps_the_last_tokens() -> None:
    # a text keeps its BOS (vLLM lets the tokenizer truncate it), and is echoed as it was sent
    p = plan(prompt=["abcdef", "xy"], truncate_prompt_tokens=3, echo=True)
    assert [it.request.prompt_token_ids for it in p.items] == [(BOS, *ids_of("ef")), (BOS, *ids_of("xy"))]
    assert [it.echo_text for it in p.items] == ["abcdef", "xy"]
    assert p.prompt_tokens == 6
    # with an explicit side the whole encoding is cut, as vLLM does
    assert plan(prompt="abcdef", truncate_prompt_tokens=3, truncation_side="left").items[
        0
    ].request.prompt_token_ids == (ids_of("def"))
    assert plan(prompt="abcdef", truncate_prompt_tokens=3, add_special_tokens=False).items[
        0
    ].request.prompt_token_ids == (ids_of("def"))
    q = plan(prompt=[[5, 6, 7, 8], [9]], truncate_prompt_tokens=3, echo=True)
    assert [it.request.prompt_token_ids for it in q.items] == [(6, 7, 8), (9,)]
    assert [it.echo_text for it in q.items] == [TOK.decode((5, 6, 7, 8)), TOK.decode((9,))]  # as sent


def test_truncate_prompt_tokens_longer_than_the_prompt_keeps_it_whole() -> None:
    p = plan(prompt="ab", truncate_prompt_tokens=10, echo=True)
    assert p.items[0].request.prompt_token_ids == (BOS, *ids_of("ab"))
    assert p.items[0].echo_text == "ab"


def test_truncate_prompt_tokens_minus_one_keeps_the_context_less_one_and_max_tokens_shrinks() -> None:
    # vLLM 0.32: -1 is max_model_len - 1 (SMALL: 31), then max_tokens shrinks to the one left
    p = plan(SMALL, prompt="x" * 40, max_tokens=12, truncate_prompt_tokens=-1)
    assert p.items[0].request.prompt_token_ids == (BOS, *ids_of("x" * 30))
    assert p.items[0].request.params.max_tokens == 1


def test_truncate_prompt_tokens_is_bounded_by_the_context_not_by_the_room_max_tokens_leaves() -> None:
    p = plan(SMALL, prompt="x" * 10, max_tokens=30, truncate_prompt_tokens=30)  # 30 > 32 - 30, allowed
    assert len(p.items[0].request.prompt_token_ids) == 11 and p.items[0].request.params.max_tokens == 21
    err = refuse(SMALL, prompt="x", max_tokens=12, truncate_prompt_tokens=33)
    assert err.param == "truncate_prompt_tokens" and "cannot be greater than max_model_len = 32" in str(err.message)
    # truncated to the whole context: no room for an output token, refused as vLLM refuses it
    assert refuse(SMALL, prompt="x" * 40, max_tokens=5, truncate_prompt_tokens=32).param == "max_tokens"


def test_truncation_side_right_keeps_the_first_tokens() -> None:
    p = plan(prompt=[[5, 6, 7, 8]], truncate_prompt_tokens=2, truncation_side="right")
    assert p.items[0].request.prompt_token_ids == (5, 6)
    assert plan(prompt="abcd", truncate_prompt_tokens=2, truncation_side="right").items[0].request.prompt_token_ids == (
        BOS,
        *ids_of("a"),
    )
    q = plan(prompt=[[5, 6, 7, 8]], truncate_prompt_tokens=2, truncation_side="left")
    assert q.items[0].request.prompt_token_ids == (7, 8)


def test_a_text_too_long_for_any_tokenizing_is_refused_before_tokenizing() -> None:
    limit = SMALL.max_model_len * TOK.max_chars_per_token
    err = refuse(SMALL, prompt=["ok", "x" * (limit + 1)], max_tokens=1)
    assert err.param == "input_text" and f"contains {limit + 1} characters (more than {limit}" in str(err.message)
    assert refuse(SMALL, prompt="x" * limit, max_tokens=1).param == "input_tokens"  # tokenized, then too long
    # with truncation the text is cut instead
    assert (
        len(
            plan(SMALL, prompt="x" * (limit + 1), max_tokens=1, truncate_prompt_tokens=5)
            .items[0]
            .request.prompt_token_ids
        )
        == 5
    )
    # the request-level checks come first, as in vLLM
    assert refuse(SMALL, prompt="x" * (limit + 1), max_tokens=40).param == "max_tokens"


def test_prompt_tokens_are_counted_once_per_prompt_not_per_choice() -> None:
    p = plan(prompt=["ab", "cde"], n=3)
    assert p.prompt_tokens == 3 + 4
    assert p.num_choices == 6
    q = plan(prompt=[[5], [6, 7]], n=4)
    assert q.prompt_tokens == 1 + 2 and q.num_choices == 8


def test_flags_are_carried_into_the_plan() -> None:
    p = plan(
        prompt="x",
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        logprobs=2,
        echo=True,
        return_token_ids=True,
        return_tokens_as_token_ids=True,
    )
    assert (p.stream, p.include_usage, p.continuous_usage, p.logprobs, p.prompt_logprobs) == (True, True, True, 2, 2)
    assert p.return_token_ids and p.tokens_as_ids and p.echo
    q = plan(prompt="x")
    assert not (q.stream or q.include_usage or q.continuous_usage or q.return_token_ids or q.tokens_as_ids or q.echo)
