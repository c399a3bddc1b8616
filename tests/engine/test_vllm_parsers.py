"""braid.engine.vllm_parsers: vLLM's parsers behind braid's adapter, on the tiny model's tokenizer.

The split-invariance property (issue 26): for any split of a choice's token stream into deltas,
including the multi-token deltas a lagging reader's merge would make, the deltas braid's adapter
streams, rebuilt, equal the adapter's parse of the whole output. braid feeds the parser one engine
step at a time; this property is what makes that safe for the formats checked here. No engine runs
(vLLM's package and the model's tokenizer only), but the tokenizer is the default model's, built
by the vLLM tier: hence the marker.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from braid.engine.tool_calls import ParsedDelta, ParsedOutput, ToolCall, rebuild
from braid.engine.vllm_parsers import (
    ParserConfigError,
    ParserOptions,
    Parsers,
    load_parsers,
    reasoning_parser_names,
    tool_parser_names,
)

pytestmark = pytest.mark.vllm

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}},
    },
]

# Outputs in each format: plain text, one call, two calls (with text before them where the format
# allows it), as the model would write them.
OUTPUTS: dict[str, list[str]] = {
    "hermes": [
        "It is sunny in Paris.",
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',
        'Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>',
    ],
    "pythonic": [
        "It is sunny in Paris.",
        "[get_weather(city='Paris')]",
        "[get_weather(city='Paris', unit='C'), get_time(tz='CET')]",
    ],
    "qwen3_coder": [
        "It is sunny in Paris.",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
        "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=unit>\nC\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n"
        "<parameter=tz>\nCET\n</parameter>\n</function>\n</tool_call>",
    ],
}


@cache
def _tokenizer() -> Any:
    from vllm.tokenizers import get_tokenizer

    from tools.servers import tiny_model_dir

    return get_tokenizer(str(tiny_model_dir()))


@cache
def _parsers(tool: str | None, reasoning: str | None = None) -> Parsers:
    options = ParserOptions(enable_auto_tool_choice=tool is not None, tool_call_parser=tool, reasoning_parser=reasoning)
    parsers = load_parsers(options, _tokenizer())
    assert parsers is not None
    return parsers


def _stream(parsers: Parsers, text: str, sizes: list[int], **request: Any) -> list[ParsedDelta]:
    """``text``'s tokens fed as deltas of ``sizes`` tokens (the last takes the rest)."""
    tok = _tokenizer()
    ids = tok.encode(text, add_special_tokens=False)
    parser = parsers.for_request(
        tools=TOOLS, tool_choice=None, parallel_tool_calls=None, chat_template_kwargs=None, **request
    ).choice([1, 2])
    out, start, previous = [], 0, ""
    bounds = []
    for size in sizes:
        if start + size >= len(ids):
            break
        start += size
        bounds.append(start)
    bounds.append(len(ids))
    start = 0
    for end in bounds:
        current = tok.decode(ids[:end], skip_special_tokens=False)
        out.append(parser.feed(current[len(previous) :], ids[start:end], finished=end == len(ids)))
        previous, start = current, end
    return out


def _whole(parsers: Parsers, text: str) -> ParsedOutput:
    ids = _tokenizer().encode(text, add_special_tokens=False)
    request = parsers.for_request(tools=TOOLS, tool_choice=None, parallel_tool_calls=None, chat_template_kwargs=None)
    return request.choice([1, 2]).parse(text, ids)


# vLLM's qwen3_coder streams the whitespace around its calls as content, which its parse() of the
# whole output strips ("Checking.\n\n" against "Checking."): a difference of vLLM's own server too.
# For that format alone the contents are compared without their surrounding whitespace.
WHITESPACE_AROUND_CALLS = {"qwen3_coder"}


def _same(streamed: ParsedOutput, whole: ParsedOutput, *, strip: bool = False) -> None:
    """Equal but for the ids, which are made per call (each must be there, and distinct)."""
    if strip:
        assert (streamed.content or "").strip() == (whole.content or "").strip()
    else:
        assert streamed.content == whole.content
    assert streamed.reasoning == whole.reasoning
    assert [(c.name, c.arguments) for c in streamed.tool_calls] == [(c.name, c.arguments) for c in whole.tool_calls]
    for calls in (streamed.tool_calls, whole.tool_calls):
        assert all(c.id for c in calls) and len({c.id for c in calls}) == len(calls)


@pytest.mark.parametrize("fmt", sorted(OUTPUTS))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_streamed_calls_rebuilt_equal_the_whole_parse_for_any_split(fmt: str, data: st.DataObject) -> None:
    text = data.draw(st.sampled_from(OUTPUTS[fmt]), label="output")
    sizes = data.draw(st.lists(st.integers(1, 40), min_size=1, max_size=60), label="delta sizes")
    parsers = _parsers(fmt)
    _same(rebuild(_stream(parsers, text, sizes)), _whole(parsers, text), strip=fmt in WHITESPACE_AROUND_CALLS)


@pytest.mark.parametrize("fmt", sorted(OUTPUTS))
def test_the_calls_are_found(fmt: str) -> None:
    # the property above must not pass vacuously: the formats' outputs hold the calls
    parsers = _parsers(fmt)
    plain, one, two = (_whole(parsers, t) for t in OUTPUTS[fmt])
    assert plain == ParsedOutput("It is sunny in Paris.", None, ())
    assert [c.name for c in one.tool_calls] == ["get_weather"]
    assert json.loads(one.tool_calls[0].arguments) == {"city": "Paris"}
    assert [c.name for c in two.tool_calls] == ["get_weather", "get_time"]
    assert json.loads(two.tool_calls[1].arguments) == {"tz": "CET"}
    for sizes in ([1], [3], [10_000]):  # one token a delta, three, the whole output in one delta
        assert [c.name for c in rebuild(_stream(parsers, OUTPUTS[fmt][2], sizes)).tool_calls] == [
            "get_weather",
            "get_time",
        ]


def test_reasoning_and_calls_together_split_alike() -> None:
    parsers = _parsers("hermes", "qwen3")
    text = '<think>The user wants the weather.</think>\n<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    whole = _whole(parsers, text)
    assert whole.reasoning == "The user wants the weather." and [c.name for c in whole.tool_calls] == ["get_weather"]
    for sizes in ([1], [2], [5], [10_000], [3, 1, 7, 2]):
        # the "\n" between </think> and the call streams as content; parse() drops it (as above)
        _same(rebuild(_stream(parsers, text, sizes)), whole, strip=True)


def test_a_wrong_name_is_one_line_listing_the_valid_ones() -> None:
    with pytest.raises(ParserConfigError) as err:
        load_parsers(ParserOptions(enable_auto_tool_choice=True, tool_call_parser="hermez"), _tokenizer())
    message = str(err.value)
    assert "\n" not in message and "'hermez'" in message and "hermes" in message and "pythonic" in message
    with pytest.raises(ParserConfigError, match="qwen3"):
        load_parsers(ParserOptions(reasoning_parser="qwen4"), _tokenizer())
    assert "hermes" in tool_parser_names() and "qwen3" in reasoning_parser_names()


def test_the_flags_go_together_as_on_vllm() -> None:
    with pytest.raises(ParserConfigError, match="--enable-auto-tool-choice"):
        load_parsers(ParserOptions(tool_call_parser="hermes"), _tokenizer())
    with pytest.raises(ParserConfigError, match="--tool-call-parser"):
        load_parsers(ParserOptions(enable_auto_tool_choice=True), _tokenizer())
    assert load_parsers(ParserOptions(), _tokenizer()) is None


def test_a_parser_that_needs_tokens_the_model_lacks_is_refused_at_start() -> None:
    # llama3_json looks for <|python_tag|>, which the tiny tokenizer does not have
    with pytest.raises(ParserConfigError, match="llama3_json"):
        load_parsers(ParserOptions(enable_auto_tool_choice=True, tool_call_parser="llama3_json"), _tokenizer())


def test_a_failing_parser_passes_its_text_on_as_content() -> None:
    parsers = _parsers("hermes")
    parser = parsers.for_request(
        tools=TOOLS, tool_choice=None, parallel_tool_calls=None, chat_template_kwargs=None
    ).choice([1])

    class Broken:
        def parse_delta(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("a parser bug")

        def set_prompt_token_ids(self, ids: Any) -> None:
            pass

        def parse(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("a parser bug")

    parser.parser = Broken()
    assert parser.feed("<tool_", [1], finished=False) == ParsedDelta(content="<tool_")
    assert parser.feed("call>", [2], finished=True) == ParsedDelta(content="call>")
    assert parser.parse("<tool_call>", [1, 2]) == ParsedOutput("<tool_call>", None)
    assert ToolCall("a", "b", "{}") != ToolCall("a", "b", "{ }")
