"""``Tokenizer.parser_tokenizer``: what vLLM's tool-call and reasoning parsers read. The scripted
engine's :class:`~braid.engine.scripted.HfView` (its interface, and vLLM's hermes and qwen3
parsers finding a call in what the scripted engine says), and the vLLM engines' tokenizer (vLLM's
own, for the tiny model). The tests that import vLLM are marked."""

from __future__ import annotations

import json
from typing import Any

import pytest

from braid.engine.base import EngineOutput, EngineRequest, SamplingParams
from braid.engine.scripted import ByteTokenizer, HfView, ScriptedEngine
from braid.engine.tool_calls import ParsedDelta, rebuild

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
REPLY = '<think>hmm</think><tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def test_the_view_spells_the_vocabulary_as_token_strs() -> None:
    tokenizer = ByteTokenizer()
    view = tokenizer.parser_tokenizer()
    assert isinstance(view, HfView) and tokenizer.parser_tokenizer() is view  # made once
    vocab = view.get_vocab()
    assert vocab is view.vocab and len(vocab) == tokenizer.vocab_size == 259
    assert [vocab[t] for t in ("<s>", "</s>", "<pad>", "a", "<", " ", "<0x0A>", "<0xC3>")] == [
        0,
        1,
        2,
        ord("a") + 3,
        ord("<") + 3,
        ord(" ") + 3,
        10 + 3,
        0xC3 + 3,
    ]
    assert sorted(vocab.values()) == list(range(259))
    assert view.convert_ids_to_tokens(list(range(259))) == tokenizer.token_strs(range(259))
    assert view.convert_ids_to_tokens([0, 100, 1], skip_special_tokens=True) == ["a"]
    assert view.convert_ids_to_tokens(100) == "a"
    assert view.convert_tokens_to_ids("a") == 100 and view.convert_tokens_to_ids(["</s>", "<think>"]) == [1, None]
    assert view.all_special_tokens == ["<s>", "</s>", "<pad>"] and view.all_special_ids == [0, 1, 2]
    assert (view.bos_token_id, view.eos_token_id, view.name_or_path) == (0, 1, "scripted")


def test_the_view_encodes_and_decodes_as_the_tokenizer() -> None:
    view = ByteTokenizer().parser_tokenizer()
    ids = view.encode("é<x>", add_special_tokens=False, truncation=None)
    assert ids == [0xC3 + 3, 0xA9 + 3, ord("<") + 3, ord("x") + 3, ord(">") + 3]
    assert view.encode("é<x>") == [0, *ids]
    assert view.decode([*ids, 1]) == "é<x>"  # special tokens skipped unless asked
    assert view.decode([*ids, 1], skip_special_tokens=False) == "é<x></s>"
    assert view.decode(ord("x") + 3) == "x"


def _parsers() -> Any:
    from braid.engine.vllm_parsers import load_parsers
    from braid.settings import ParserOptions

    options = ParserOptions(enable_auto_tool_choice=True, tool_call_parser="hermes", reasoning_parser="qwen3")
    parsers = load_parsers(options, ByteTokenizer().parser_tokenizer())
    assert parsers is not None
    return parsers.for_request(tools=TOOLS, tool_choice=None, parallel_tool_calls=None, chat_template_kwargs=None)


@pytest.mark.vllm
def test_vllms_hermes_and_qwen3_parsers_read_the_view() -> None:
    view = ByteTokenizer().parser_tokenizer()
    whole = _parsers().choice([0]).parse(REPLY, view.encode(REPLY, add_special_tokens=False))
    assert whole.reasoning == "hmm" and not whole.content
    ((call,),) = [whole.tool_calls]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}


@pytest.mark.vllm
async def test_a_call_the_scripted_engine_says_is_found_step_by_step_through_observe() -> None:
    # The scripted engine "writes" a tool call; each engine step is fed to the parser through
    # observe, as braid streams a chat response, one byte token at a time.
    parsed: dict[int, list[ParsedDelta]] = {0: [], 1: []}
    request = _parsers()
    choices = [request.choice([0]), request.choice([0])]

    def observe(output: EngineOutput) -> None:
        for d in output.choices:
            parsed[d.index].append(choices[d.index].feed(d.text, d.token_ids, finished=d.finish_reason is not None))

    engine = ScriptedEngine()
    prompt = f"<|user|>\nweather?<braid:say>{REPLY}</braid:say><braid:say><think>ok</think>It is sunny.</braid:say>"
    ids = tuple(engine.tokenizer.encode(prompt))
    async with engine.open_request(EngineRequest("t", ids, SamplingParams(max_tokens=200, n=2)), observe=observe) as o:
        async for _ in o:
            pass
    assert len(parsed[0]) == len(REPLY) + 1  # one delta per step: the script's bytes, then EOS
    call, plain = rebuild(parsed[0]), rebuild(parsed[1])
    assert call.reasoning == "hmm" and [c.name for c in call.tool_calls] == ["get_weather"]
    assert json.loads(call.tool_calls[0].arguments) == {"city": "Paris"}
    assert (plain.reasoning, plain.content, plain.tool_calls) == ("ok", "It is sunny.", ())


@pytest.mark.vllm
def test_the_vllm_engines_parser_tokenizer_is_vllms_own_for_the_model() -> None:
    from transformers import AutoTokenizer

    from braid.engine.vllm_common import HfTokenizer
    from tools.servers import tiny_model_dir

    path = str(tiny_model_dir())
    hf = AutoTokenizer.from_pretrained(path)
    tokenizer = HfTokenizer(hf, hf.vocab_size)
    parser_tokenizer = tokenizer.parser_tokenizer()
    assert tokenizer.parser_tokenizer() is parser_tokenizer  # loaded once
    assert parser_tokenizer is not hf and type(parser_tokenizer).__module__.startswith("vllm.")
    assert parser_tokenizer.name_or_path == path and parser_tokenizer.get_vocab() == hf.get_vocab()
    text = '<tool_call>{"name": "f"}</tool_call>'
    assert parser_tokenizer.encode(text, add_special_tokens=False) == tokenizer.encode(text, add_special_tokens=False)
