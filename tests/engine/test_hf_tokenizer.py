"""HfTokenizer (braid.engine.vllm_common): which copy encode_many uses, over fake tokenizers; what its
apply_chat_template hands the template (tools, the template chosen, developer messages)."""

from __future__ import annotations

import types
from typing import Any

import pytest

from braid.engine.vllm_common import HfTokenizer, developer_as_system
from braid.errors import InvalidRequest
from braid.wire.messages import TemplateOptions, parse_messages, parse_tools
from braid.wire.messages import render as messages_render


class FakeBackend:
    """A Rust backend as HfTokenizer sees it; ``shift`` makes a copy encode differently."""

    def __init__(self, shift: int = 0, copies_shift: int = 0, copyable: bool = True) -> None:
        self.shift, self.copies_shift, self.copyable = shift, copies_shift, copyable
        self.batches = 0

    def to_str(self) -> str:
        if not self.copyable:
            raise RuntimeError("cannot serialize")
        return str(self.copies_shift)

    @classmethod
    def from_str(cls, text: str) -> FakeBackend:
        return cls(shift=int(text))

    def encode(self, text: str, add_special_tokens: bool = True) -> types.SimpleNamespace:
        return types.SimpleNamespace(ids=ids(text, add_special_tokens, self.shift))

    def encode_batch(self, texts: list[str], add_special_tokens: bool = True) -> list[types.SimpleNamespace]:
        self.batches += 1
        return [self.encode(t, add_special_tokens) for t in texts]


def ids(text: str, special: bool, shift: int = 0) -> list[int]:
    return ([1] if special else []) + [ord(c) + shift for c in text]


class FakeHf:
    def __init__(self, backend: FakeBackend | None) -> None:
        self._tokenizer = backend
        self.encodes = 0

    def get_vocab(self) -> dict[str, int]:
        return {"a": 0, "<pad>": 1}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.encodes += 1
        return ids(text, add_special_tokens)


TEXTS = ["ab", "", "é東"]


def test_a_copy_that_encodes_alike_is_used_for_batches() -> None:
    tok = HfTokenizer(FakeHf(FakeBackend()), 100)
    assert tok.max_chars_per_token == 5  # "<pad>", as vLLM counts it
    assert tok._worker_backend is not None
    assert tok.encode_many(TEXTS, add_special_tokens=False) == [ids(t, False) for t in TEXTS]
    assert tok._worker_backend.batches == 1


def test_a_copy_that_encodes_differently_is_not_used() -> None:
    hf = FakeHf(FakeBackend(copies_shift=1))
    tok = HfTokenizer(hf, 100)
    assert tok._worker_backend is None and tok._worker_tok is not hf  # a deep copy of its own
    assert tok.encode_many(TEXTS) == [ids(t, True) for t in TEXTS]


def test_a_backend_that_cannot_be_copied_falls_back_to_a_copy_of_the_tokenizer() -> None:
    hf = FakeHf(FakeBackend(copyable=False))
    tok = HfTokenizer(hf, 100)
    assert tok._worker_backend is None and tok._worker_tok is not hf
    assert tok.encode_many(TEXTS) == [ids(t, True) for t in TEXTS]


def test_a_slow_tokenizer_loops_encode_on_its_copy() -> None:
    hf = FakeHf(None)
    tok = HfTokenizer(hf, 100)
    assert tok.encode_many(TEXTS) == [ids(t, True) for t in TEXTS]
    assert hf.encodes == 0  # the Trio thread's instance was not used


def test_encode_calls_the_backend_directly_when_it_encodes_alike() -> None:
    hf = FakeHf(FakeBackend())
    tok = HfTokenizer(hf, 100)
    before = hf.encodes  # the probes
    assert tok.encode("é東", add_special_tokens=False) == ids("é東", False)
    assert tok.encode("ab") == ids("ab", True)
    assert hf.encodes == before  # not through the wrapper


def test_encode_keeps_the_wrapper_when_the_backend_encodes_differently() -> None:
    hf = FakeHf(FakeBackend(shift=1))  # the wrapper adds a step of its own; its copies do not
    tok = HfTokenizer(hf, 100)
    before = hf.encodes
    assert tok.encode("ab") == ids("ab", True)
    assert hf.encodes == before + 1


# -- apply_chat_template: what reaches the template, as vLLM's safe_apply_chat_template hands it


class TemplateHf(FakeHf):
    """A transformers tokenizer as apply_chat_template uses it: named templates, and a record of
    each call."""

    def __init__(self, template: str | dict[str, str] | None) -> None:
        super().__init__(FakeBackend())
        self.chat_template = template
        self.calls: list[dict[str, Any]] = []

    def get_chat_template(self, chat_template: str | None = None, tools: list | None = None) -> str:
        named = self.chat_template
        if isinstance(named, dict):
            if chat_template is not None:
                return named.get(chat_template, chat_template)
            return named["tool_use" if tools is not None and "tool_use" in named else "default"]
        if chat_template is not None:
            return chat_template
        if named is None:
            raise ValueError("no chat template")
        return named

    def apply_chat_template(self, messages: list, **kwargs: Any) -> str:
        self.calls.append({"messages": messages, **kwargs})
        return "text"


def render(tok: HfTokenizer, messages: list, tools: list | None = None, kwargs: dict | None = None) -> None:
    tok.apply_chat_template(
        messages,
        add_generation_prompt=True,
        continue_final_message=False,
        chat_template=None,
        template_kwargs=kwargs or {},
        tools=tools,
    )


TOOLS = [{"type": "function", "function": {"name": "f", "description": None, "parameters": None}}]


def test_tools_reach_the_template_and_pick_a_named_one() -> None:
    hf = TemplateHf({"default": "plain", "tool_use": "with tools"})
    tok = HfTokenizer(hf, 100)
    # template kwargs never override apply_chat_template's own arguments
    render(tok, [{"role": "user", "content": "x"}], TOOLS, {"tools": [{"ignored": 1}], "x": 1, "tokenize": True})
    render(tok, [{"role": "user", "content": "x"}])
    first, second = hf.calls
    assert (first["chat_template"], first["tools"], first["x"], first["tokenize"]) == ("with tools", TOOLS, 1, False)
    assert (second["chat_template"], second["tools"]) == ("plain", None)


def test_no_template_is_a_400() -> None:
    with pytest.raises(InvalidRequest, match="no chat template"):
        render(HfTokenizer(TemplateHf(None), 100), [{"role": "user", "content": "x"}])


def test_developer_messages_become_system_unless_the_template_names_the_role() -> None:
    conversation = [
        {"role": "user", "content": "u"},
        {"role": "developer", "content": "d", "tools": None, "name": "n"},
        {"role": "system", "content": "s"},
    ]
    hf = TemplateHf("{% for m in messages %}{{ m.content }}{% endfor %}")
    render(HfTokenizer(hf, 100), conversation)
    assert hf.calls[0]["messages"] == [{"role": "system", "content": "d\n\ns"}, {"role": "user", "content": "u"}]
    hf = TemplateHf("{% if m.role == 'developer' %}{% endif %}")
    render(HfTokenizer(hf, 100), conversation)
    assert hf.calls[0]["messages"] == conversation


@pytest.mark.parametrize(
    "conversation",
    [
        [{"role": "developer", "content": "d", "tools": [1]}, {"role": "user", "content": "u"}],
        [{"role": "system", "content": "s"}, {"role": "developer", "content": "d", "tools": None}],
        [{"role": "user", "content": "u"}, {"role": "developer", "content": "", "tools": None, "name": "x"}],
        [{"role": "system", "content": ""}, {"role": "developer", "content": "d", "tools": None}],
        [
            {"role": "developer", "content": "a", "tools": None},
            {"role": "user", "content": "u"},
            {"role": "system", "content": "b"},
            {"role": "assistant", "content": "c"},
        ],
    ],
)
def test_developer_as_system_is_vllms_conversion(conversation: list[dict[str, Any]]) -> None:
    pytest.importorskip("vllm")
    from vllm.renderers.hf import _consolidate_system_messages, _convert_developer_to_system

    expected = _consolidate_system_messages(_convert_developer_to_system(conversation))  # type: ignore[arg-type]
    assert developer_as_system(conversation) == expected


TEMPLATE = (
    "{% if tools %}[tools:{% for t in tools %} {{ t.function.name }}{% endfor %}]{% endif %}"
    "{% for m in messages %}<{{ m.role }}{% if m.tool_call_id is defined %} {{ m.tool_call_id }}{% endif %}>"
    "{{ m.content }}{% for c in m.tool_calls or [] %}[{{ c.id }} {{ c.function.name }}"
    " city={{ c.function.arguments.city }}]{% endfor %}</{{ m.role }}>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def test_a_real_template_reads_tools_calls_and_tool_messages() -> None:
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    vocab = tokenizers.models.WordLevel({"<unk>": 0, "a": 1}, unk_token="<unk>")
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizers.Tokenizer(vocab))
    hf.chat_template = TEMPLATE
    messages = parse_messages(
        [
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                    }
                ],
            },
            {"role": "tool", "content": "rain", "tool_call_id": "c1"},
        ]
    )
    options = TemplateOptions(tools=parse_tools([{"function": {"name": "get_weather"}}]))
    assert messages_render(HfTokenizer(hf, 2), messages, options) == (
        "[tools: get_weather]<user>Weather?</user><assistant>[c1 get_weather city=Oslo]</assistant>"
        "<tool c1>rain</tool><assistant>"
    )
