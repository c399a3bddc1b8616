"""The chat cases of the matrix: ``/v1/chat/completions``, ``/v1/chat/completions/batch``,
``/tokenize`` and ``/detokenize``, sent to braid and vLLM's own server like the completions cases.

The tiny model's chat template (``braid.models.tiny.CHAT_TEMPLATE``) renders each message as
``<|role|>\\ncontent</s>\\n`` and ``<|assistant|>\\n`` as the generation prompt; it reads no
template kwargs and ignores ``tools``, ``tool_calls`` and ``tool_call_id`` (and never names the
developer role, so both servers render a developer message as a system message). Requests are
greedy unless a case is about sampling.
Every chat case name starts with "chat", "batch chat", "tokenize" or "detokenize", so
``pytest -k "chat or tokenize"`` selects them.
"""

from __future__ import annotations

from typing import Any

from tests.parity.matrix import MODEL, Case

CHAT = "/v1/chat/completions"
BATCH = "/v1/chat/completions/batch"
KV_IDS = [300, 301, 302, 303, 304]  # a prefill stage's prompt ids (kv_transfer_params)
TOKENIZE = "/tokenize"
DETOKENIZE = "/detokenize"

SYSTEM = {"role": "system", "content": "You write Python."}
USER = {"role": "user", "content": "def parse(self, data):"}
USER2 = {"role": "user", "content": "import os\nimport sys\n"}
ASSISTANT = {"role": "assistant", "content": "    return data\n"}
PREFILL = {"role": "assistant", "content": "def f(x):\n"}

SYS_USER = [SYSTEM, USER]
MULTI_TURN = [SYSTEM, USER, ASSISTANT, USER2]
TEXT_PARTS = [
    SYSTEM,
    {"role": "user", "content": [{"type": "text", "text": "import os"}, {"type": "text", "text": "class Foo:"}]},
]
TOOL_TURN = [
    USER,
    {"role": "assistant", "content": "Calling the tool."},
    {"role": "tool", "content": "42", "tool_call_id": "call_1"},
]
ENDS_WITH_ASSISTANT = [USER, PREFILL]
ASSISTANT_PARTS = [
    USER,
    {"role": "assistant", "content": [{"type": "text", "text": "def f(x):"}, {"type": "text", "text": "    y = x"}]},
]
CONVERSATIONS = [SYS_USER, [USER2], MULTI_TURN]
TOOL = {
    "type": "function",
    "function": {
        "name": "get_answer",
        "description": "The answer.",
        "parameters": {"type": "object", "properties": {}},
    },
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
# A tool-calling history (issue 26 §2): the tiny template writes only each message's content, so
# these cases compare what both servers take and refuse, the prompt tokens (the content of an
# assistant message that only called a tool is ""), and the developer role's conversion.
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_answer", "arguments": '{"q": "life"}'}}
TOOL_HISTORY = [
    USER,
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "content": [{"type": "text", "text": "42"}], "tool_call_id": "call_1"},
    USER2,
]
REASONING_HISTORY = [
    USER,
    {"role": "assistant", "content": "    return data\n", "reasoning_content": "Think first."},
    USER2,
]
CUSTOM_CALL = {"id": "call_2", "type": "custom", "custom": {"name": "get_answer", "input": "x"}}

# Reasoning (issue 26 §8): both servers run gemma4's reasoning parser (tools/servers.py TOOL_FLAGS),
# whose markers are plain text to the tiny model, which never writes them itself: a regex makes
# it. A prompt never opens reasoning, so the engine's grammar applies from the first token.
# Whole, the parser splits the text at the markers; streamed, only with ``enable_thinking``
# (``chat_template_kwargs``, or a ``reasoning_effort`` other than "none"): otherwise gemma4's
# stream is content, marker included, on vLLM as on braid. With thinking on, vLLM applies a grammar
# only under ``include_reasoning: false`` (it waits for the end of the reasoning, which its engine
# finds only as a special token): the streamed reasoning cases hide the reasoning.
THINK = r"<\|channel>thought" + "\n"  # gemma4's opener, "thought" its role label
THOUGHT_END = r"<channel\|>"
ANSWER = {"regex": THINK + r"Code it\." + THOUGHT_END + r"def f\(\):"}
FREE_THOUGHT = {"regex": THINK + r"[a-z]{2,6}( [a-z]{2,6})?\." + THOUGHT_END + "[a-z]{2,6}"}
THEN_CALL = {"regex": THINK + r"Weather\." + THOUGHT_END + r"\[get_weather\(city='Paris'\)\]"}
ENDLESS_THOUGHT = {"regex": THINK + "[a-z ]{40}" + THOUGHT_END + "ok"}  # cut by max_tokens 20
THINKING = {"enable_thinking": True}
WITH_REASONING = [
    USER,
    {"role": "assistant", "content": "    return data\n", "reasoning": "Think first."},
    USER2,
]


def _with_call(**call: Any) -> list[dict[str, Any]]:
    return [USER, {"role": "assistant", "content": None, "tool_calls": [{**CALL, **call}]}, USER2]


# Enough text to take more than the 1024-token context once templated.
LONG = [{"role": "user", "content": " ".join(f"x{i} = {i}" for i in range(600))}]


def _chat(messages: Any = SYS_USER, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0}
    body.update(fields)
    return {k: v for k, v in body.items() if v is not _DROP}


_DROP = object()


def chat_cases() -> list[Case]:
    c: list[Case] = []

    def chat(name: str, group: str, body: Any, **kw: Any) -> None:
        c.append(Case(name, group, body, path=CHAT, **kw))

    def batch(name: str, group: str, body: Any, **kw: Any) -> None:
        c.append(Case(name, group, body, path=BATCH, **kw))

    # -- conversation shapes
    chat("chat system + user", "chat", _chat())
    chat("chat user only", "chat", _chat([USER]))
    chat("chat multi-turn", "chat", _chat(MULTI_TURN))
    chat("chat content as text parts", "chat", _chat(TEXT_PARTS))
    chat("chat tool message as text", "chat", _chat(TOOL_TURN))
    chat("chat any role string is rendered", "chat", _chat([{"role": "wizard", "content": "abracadabra"}]))
    chat("chat tools with tool_choice none", "chat", _chat(tools=[TOOL], tool_choice="none"))
    # -- tool-calling histories: what reaches the template, as vLLM hands it
    chat("chat history with a tool call and its result", "chat", _chat(TOOL_HISTORY, return_token_ids=True))
    chat(
        "chat history with tools and tool_choice none",
        "chat",
        _chat(TOOL_HISTORY, tools=[TOOL], tool_choice="none", return_token_ids=True),
    )
    chat(
        "chat history with invalid JSON arguments", "chat", _chat(_with_call(function={"name": "f", "arguments": "{"}))
    )
    chat("chat history with an empty tool_calls", "chat", _chat([USER, {**ASSISTANT, "tool_calls": []}, USER2]))
    chat("chat history with reasoning_content", "chat", _chat(REASONING_HISTORY, return_token_ids=True))
    chat(
        "chat developer message becomes system, moved first",
        "chat",
        _chat([USER, {"role": "developer", "content": "Be brief."}, SYSTEM, USER2], return_token_ids=True),
    )
    chat("chat a user's tool_calls are ignored", "chat", _chat([{**USER, "tool_calls": [{"junk": 1}]}]))
    chat("chat response_format text", "chat", _chat(response_format={"type": "text"}))
    chat("chat unknown fields are ignored", "chat", _chat(user="u-1", some_unknown_field=3))
    # -- max tokens
    chat("chat max_completion_tokens", "chat", _chat(max_tokens=_DROP, max_completion_tokens=5))
    chat("chat max_completion_tokens over max_tokens", "chat", _chat(max_tokens=12, max_completion_tokens=3))
    chat("chat max_tokens omitted: the room left", "chat", _chat([USER2], max_tokens=_DROP))
    chat("chat ignore_eos", "chat", _chat(max_tokens=40, ignore_eos=True))
    chat("chat min_tokens", "chat", _chat(max_tokens=30, min_tokens=25))
    chat("chat truncate_prompt_tokens", "chat", _chat(truncate_prompt_tokens=6, return_token_ids=True))
    # -- template flags
    chat("chat add_generation_prompt false", "chat", _chat(add_generation_prompt=False))
    chat(
        "chat continue_final_message",
        "chat",
        _chat(ENDS_WITH_ASSISTANT, add_generation_prompt=False, continue_final_message=True, return_token_ids=True),
    )
    chat("chat add_special_tokens true", "chat", _chat(add_special_tokens=True, return_token_ids=True))
    chat("chat chat_template_kwargs", "chat", _chat(chat_template_kwargs={"enable_thinking": False, "x": 1}))
    # -- echo: the last message is prepended when its role is the response's role
    chat(
        "chat echo the last assistant message",
        "chat",
        _chat(ENDS_WITH_ASSISTANT, add_generation_prompt=False, echo=True),
    )
    chat(
        "chat echo with continue_final_message",
        "chat",
        _chat(ENDS_WITH_ASSISTANT, add_generation_prompt=False, continue_final_message=True, echo=True),
    )
    chat("chat echo, last message user: nothing echoed", "chat", _chat(echo=True))
    chat("chat echo, no generation prompt: the role is user", "chat", _chat(add_generation_prompt=False, echo=True))
    chat(
        "chat echo text parts joined",
        "chat",
        _chat(ASSISTANT_PARTS, add_generation_prompt=False, continue_final_message=True, echo=True),
    )
    chat(
        "chat echo with logprobs: prompt logprobs follow top_logprobs",
        "chat",
        _chat(ENDS_WITH_ASSISTANT, add_generation_prompt=False, echo=True, logprobs=True, top_logprobs=2, max_tokens=3),
    )
    # -- stop
    chat("chat stop strings", "chat", _chat(max_tokens=30, ignore_eos=True, stop=["\n", "("]))
    chat(
        "chat stop strings included in output",
        "chat",
        _chat(max_tokens=30, ignore_eos=True, stop=["\n"], include_stop_str_in_output=True),
    )
    chat("chat stop_token_ids", "chat", _chat(max_tokens=30, ignore_eos=True, stop_token_ids=[13, 30, 198]))
    # -- logprobs, token ids, other sampling fields
    chat("chat logprobs true", "chat", _chat(logprobs=True, max_tokens=4))
    chat("chat logprobs with top_logprobs 3", "chat", _chat(logprobs=True, top_logprobs=3, max_tokens=4))
    chat("chat prompt_logprobs 1", "chat", _chat(prompt_logprobs=1, max_tokens=2))
    chat("chat return_token_ids", "chat", _chat(MULTI_TURN, return_token_ids=True))
    chat("chat logit_bias", "chat", _chat(logit_bias={"300": 100}, max_tokens=4))
    chat(
        "chat skip_special_tokens false",
        "chat",
        _chat(skip_special_tokens=False, ignore_eos=True, max_tokens=40),
    )
    chat("chat n=3 seeded", "chat", _chat(n=3, temperature=0.8, seed=7, max_tokens=10))
    chat("chat n=2 seeded top_p/top_k", "chat", _chat(n=2, temperature=1.0, top_p=0.9, top_k=20, seed=5))
    chat("chat seeded sampling", "chat", _chat(MULTI_TURN, temperature=1.0, seed=3, max_tokens=12))
    chat(
        "chat seeded penalties",
        "chat",
        _chat(temperature=0.9, seed=1, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.2),
    )
    # -- streams
    chat("chat stream", "chat stream", _chat(stream=True))
    chat("chat stream include_usage", "chat stream", _chat(stream=True, stream_options={"include_usage": True}))
    chat(
        "chat stream include_usage + continuous_usage_stats",
        "chat stream",
        _chat(stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True}),
    )
    chat(
        "chat stream continuous_usage_stats alone",
        "chat stream",
        _chat(stream=True, stream_options={"continuous_usage_stats": True}),
    )
    chat(
        "chat stream n=2 seeded with usage",
        "chat stream",
        _chat(stream=True, n=2, temperature=0.7, seed=9, max_tokens=10, stream_options={"include_usage": True}),
    )
    chat(
        "chat stream n=2 seeded logprobs",
        "chat stream",
        _chat(stream=True, n=2, temperature=0.7, seed=9, logprobs=True, top_logprobs=2, max_tokens=6),
    )
    chat("chat stream logprobs", "chat stream", _chat(stream=True, logprobs=True, max_tokens=6))
    chat("chat stream return_token_ids", "chat stream", _chat(MULTI_TURN, stream=True, return_token_ids=True))
    chat(
        "chat stream stop string",
        "chat stream",
        _chat(stream=True, max_tokens=30, ignore_eos=True, stop=["\n"], include_stop_str_in_output=True),
    )
    chat(
        "chat stream stop_token_ids",
        "chat stream",
        _chat(stream=True, max_tokens=30, ignore_eos=True, stop_token_ids=[13, 30, 198]),
    )
    chat(
        "chat stream echo",
        "chat stream",
        _chat(ENDS_WITH_ASSISTANT, stream=True, add_generation_prompt=False, echo=True),
    )
    chat(
        "chat stream echo with continuous usage",
        "chat stream",
        _chat(
            ENDS_WITH_ASSISTANT,
            stream=True,
            add_generation_prompt=False,
            continue_final_message=True,
            echo=True,
            n=2,
            temperature=0.5,
            seed=2,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
        ),
    )
    chat("chat stream role user", "chat stream", _chat(stream=True, add_generation_prompt=False))
    chat("chat stream min_tokens", "chat stream", _chat(stream=True, max_tokens=24, min_tokens=20))
    chat(
        "chat stream max_completion_tokens 1",
        "chat stream",
        _chat(stream=True, max_tokens=_DROP, max_completion_tokens=1, stream_options={"include_usage": True}),
    )
    # -- structured output: both pass it to vLLM's structured-output backend
    chat(
        "chat response_format json_object",
        "chat structured",
        _chat(response_format={"type": "json_object"}, max_tokens=16),
    )
    schema = {"type": "object", "properties": {"a": {"enum": ["x", "y"]}}, "required": ["a"]}
    chat(
        "chat response_format json_schema",
        "chat structured",
        _chat(response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}, max_tokens=16),
    )
    chat(
        "chat structured_outputs choice",
        "chat structured",
        _chat(structured_outputs={"choice": ["yes", "no"]}),
    )
    chat(
        "chat structured_outputs regex",
        "chat structured",
        _chat(structured_outputs={"regex": "[a-c]{3}"}),
    )
    # -- errors
    chat("chat messages []", "chat errors", _chat([]))
    chat("chat messages missing", "chat errors", _chat(_DROP))
    chat("chat messages is a string", "chat errors", _chat("hello"))
    chat("chat message without a role", "chat errors", _chat([{"content": "hi"}]))
    chat("chat role is a number", "chat errors", _chat([{"role": 5, "content": "hi"}]))
    chat(
        "chat both template flags true",
        "chat errors",
        _chat(ENDS_WITH_ASSISTANT, add_generation_prompt=True, continue_final_message=True),
    )
    chat(
        "chat image_url content part",
        "chat errors",
        _chat([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/a.png"}}]}]),
    )
    chat(
        "chat input_audio content part",
        "chat errors",
        _chat(
            [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]}]
        ),
    )
    chat("chat top_logprobs without logprobs", "chat errors", _chat(top_logprobs=2))
    chat("chat negative top_logprobs", "chat errors", _chat(logprobs=True, top_logprobs=-2))
    chat("chat top_logprobs over the maximum", "chat errors", _chat(logprobs=True, top_logprobs=30))
    chat(
        "chat top_logprobs over the maximum, streamed",
        "chat errors",
        _chat(logprobs=True, top_logprobs=30, stream=True),
        deviation="eager_validation",
    )
    chat("chat prompt_logprobs with stream", "chat errors", _chat(prompt_logprobs=1, stream=True))
    chat("chat stream_options without stream", "chat errors", _chat(stream_options={"include_usage": True}))
    chat(
        "chat stream_options include_usage null with stream false",
        "chat errors",
        _chat(stream=False, stream_options={"include_usage": None}),
    )
    # kv_transfer_params: its prompt_token_ids are the prompt (not with echo; refused on the batch route)
    chat(
        "chat kv_transfer_params with prompt_token_ids",
        "chat kv",
        _chat(kv_transfer_params={"prompt_token_ids": KV_IDS}),
    )
    chat(
        "chat kv_transfer_params prompt_token_ids, streamed",
        "chat kv",
        _chat(stream=True, kv_transfer_params={"prompt_token_ids": KV_IDS, "do_remote_decode": True}),
    )
    chat(
        "chat kv_transfer_params prompt_token_ids with echo",
        "chat kv",
        _chat(echo=True, kv_transfer_params={"prompt_token_ids": KV_IDS}),
    )
    chat(
        "chat kv_transfer_params empty prompt_token_ids", "chat kv", _chat(kv_transfer_params={"prompt_token_ids": []})
    )
    chat(
        "chat kv_transfer_params negative prompt token id",
        "chat kv",
        _chat(kv_transfer_params={"prompt_token_ids": [300, -1]}),
    )
    chat(
        "chat kv_transfer_params prompt token id out of vocabulary",
        "chat kv",
        _chat(kv_transfer_params={"prompt_token_ids": [300, 5000]}),
    )
    batch(
        "batch chat kv_transfer_params with prompt_token_ids",
        "chat kv",
        _chat([SYS_USER, [USER2]], kv_transfer_params={"prompt_token_ids": KV_IDS}),
    )
    batch(
        "batch chat kv_transfer_params without prompt_token_ids",
        "chat kv",
        _chat([SYS_USER, [USER2]], kv_transfer_params={"do_remote_decode": False}),
        deviation="batch_chat_reasoning_tokens",
    )
    # -- tool calls (issue 26): both servers run pythonic's parser (tools/servers.py TOOL_FLAGS);
    # "required" and a named function force the call with a JSON schema, so the tiny model calls
    tools = [TOOL, WEATHER]
    for stream in (False, True):
        s = " streamed" if stream else ""
        st = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
        chat(f"chat tools auto{s}", "chat tools", _chat(tools=tools, tool_choice="auto", **st))
        chat(f"chat tools without tool_choice (auto){s}", "chat tools", _chat(tools=tools, **st))
        chat(f"chat tools required{s}", "chat tools", _chat(tools=tools, tool_choice="required", max_tokens=60, **st))
        chat(f"chat tools named{s}", "chat tools", _chat(tools=tools, tool_choice=NAMED, max_tokens=40, **st))
        chat(
            f"chat tools named cut by max_tokens{s}",
            "chat tools",
            _chat(tools=tools, tool_choice=NAMED, max_tokens=4, **st),
        )
        chat(
            f"chat tools required n=2 sampled{s}",
            "chat tools",
            _chat(tools=tools, tool_choice="required", max_tokens=60, n=2, temperature=1.0, seed=11, **st),
        )
        chat(
            f"chat tools required without parallel calls{s}",
            "chat tools",
            _chat(tools=tools, tool_choice="required", max_tokens=60, parallel_tool_calls=False, **st),
        )
        chat(
            f"chat tools named after a tool history{s}",
            "chat tools",
            _chat(TOOL_HISTORY, tools=tools, tool_choice=NAMED, max_tokens=40, **st),
        )
        chat(
            f"chat tools auto with a JSON response_format{s}",
            "chat tools",
            _chat(tools=tools, tool_choice="auto", response_format={"type": "json_object"}, max_tokens=20, **st),
        )
    chat(
        "chat tools named with logprobs",
        "chat tools",
        _chat(tools=tools, tool_choice=NAMED, max_tokens=30, logprobs=True, top_logprobs=2),
    )
    chat(
        "chat tools named return_token_ids",
        "chat tools",
        _chat(tools=tools, tool_choice=NAMED, max_tokens=30, return_token_ids=True),
    )
    chat(
        "chat tools a named function not in tools",
        "chat tools errors",
        _chat(tools=tools, tool_choice={"type": "function", "function": {"name": "nope"}}),
    )
    chat("chat tools tool_choice not a mode", "chat tools errors", _chat(tools=tools, tool_choice="sometimes"))
    chat(
        "chat tools named without a name",
        "chat tools errors",
        _chat(tools=tools, tool_choice={"type": "function", "function": {}}),
    )
    chat(
        "chat tools named with a response_format",
        "chat tools errors",
        _chat(tools=tools, tool_choice=NAMED, response_format={"type": "json_object"}),
    )
    chat("chat tools required without tools", "chat tools errors", _chat(tool_choice="required"))
    chat(
        "chat tools named streamed and refused",
        "chat tools errors",
        _chat(tools=tools, tool_choice={"type": "function", "function": {"name": "nope"}}, stream=True),
    )
    # -- reasoning (gemma4's parser on both servers: see THINK above)
    usage = {"stream_options": {"include_usage": True}}
    chat("chat reasoning", "chat reasoning", _chat(structured_outputs=ANSWER, max_tokens=60))
    chat(
        "chat reasoning streamed without thinking: content",
        "chat reasoning",
        _chat(structured_outputs=ANSWER, max_tokens=60, stream=True, **usage),
    )
    chat(
        "chat reasoning include_reasoning false",
        "chat reasoning",
        _chat(structured_outputs=ANSWER, max_tokens=60, include_reasoning=False),
    )
    chat(
        "chat reasoning enable_thinking, include_reasoning false",
        "chat reasoning",
        _chat(structured_outputs=ANSWER, max_tokens=60, include_reasoning=False, chat_template_kwargs=THINKING),
    )
    # With thinking on and the reasoning shown, the grammar waits for the reasoning's end: vLLM's
    # serving layer asks its parser whether the prompt ended it (reasoning_ended), and so does braid.
    chat(
        "chat reasoning enable_thinking with a grammar: it waits for the reasoning's end",
        "chat reasoning",
        _chat(structured_outputs=ANSWER, max_tokens=24, chat_template_kwargs=THINKING),
    )
    chat(
        "chat reasoning enable_thinking with a grammar, streamed",
        "chat reasoning",
        _chat(structured_outputs=ANSWER, max_tokens=24, chat_template_kwargs=THINKING, stream=True, **usage),
    )
    chat(
        "chat reasoning enable_thinking, include_reasoning false, streamed",
        "chat reasoning",
        _chat(
            structured_outputs=ANSWER,
            max_tokens=60,
            include_reasoning=False,
            chat_template_kwargs=THINKING,
            stream=True,
            **usage,
        ),
    )
    chat(
        "chat reasoning_effort high, include_reasoning false, streamed",
        "chat reasoning",
        _chat(structured_outputs=ANSWER, max_tokens=60, include_reasoning=False, reasoning_effort="high", stream=True),
    )
    chat(
        "chat reasoning_effort none, streamed",
        "chat reasoning",
        _chat(structured_outputs=ANSWER, max_tokens=60, reasoning_effort="none", stream=True, **usage),
    )
    chat(
        "chat reasoning n=2 seeded",
        "chat reasoning",
        _chat(structured_outputs=FREE_THOUGHT, max_tokens=60, n=2, temperature=1.0, seed=13),
    )
    chat(
        "chat reasoning n=2 seeded, enable_thinking, include_reasoning false, streamed",
        "chat reasoning",
        _chat(
            structured_outputs=FREE_THOUGHT,
            max_tokens=60,
            n=2,
            temperature=1.0,
            seed=13,
            include_reasoning=False,
            chat_template_kwargs=THINKING,
            stream=True,
            **usage,
        ),
    )
    chat(
        "chat reasoning then a call", "chat reasoning", _chat(tools=tools, structured_outputs=THEN_CALL, max_tokens=60)
    )
    chat(
        "chat reasoning then a call, streamed without thinking: content",
        "chat reasoning",
        _chat(tools=tools, structured_outputs=THEN_CALL, max_tokens=60, stream=True, **usage),
    )
    chat(
        "chat reasoning then a call, enable_thinking, include_reasoning false, streamed",
        "chat reasoning",
        _chat(
            tools=tools,
            structured_outputs=THEN_CALL,
            max_tokens=60,
            include_reasoning=False,
            chat_template_kwargs=THINKING,
            stream=True,
            **usage,
        ),
    )
    chat(
        "chat reasoning then a call, include_reasoning false, no parallel calls",
        "chat reasoning",
        _chat(
            tools=tools,
            structured_outputs=THEN_CALL,
            max_tokens=60,
            include_reasoning=False,
            parallel_tool_calls=False,
        ),
    )
    chat(
        "chat reasoning with logprobs",
        "chat reasoning",
        _chat(structured_outputs=ANSWER, max_tokens=60, logprobs=True, top_logprobs=2),
    )
    chat(
        "chat reasoning with logprobs, streamed",
        "chat reasoning",
        _chat(structured_outputs=ANSWER, max_tokens=60, logprobs=True, top_logprobs=2, stream=True),
    )
    chat(
        "chat reasoning include_reasoning false hides logprobs and token ids",
        "chat reasoning",
        _chat(
            structured_outputs=ANSWER,
            max_tokens=60,
            include_reasoning=False,
            logprobs=True,
            top_logprobs=2,
            return_token_ids=True,
        ),
    )
    chat(
        "chat reasoning enable_thinking, include_reasoning false hides logprobs and token ids, streamed",
        "chat reasoning",
        _chat(
            structured_outputs=ANSWER,
            max_tokens=60,
            include_reasoning=False,
            chat_template_kwargs=THINKING,
            logprobs=True,
            top_logprobs=2,
            return_token_ids=True,
            stream=True,
        ),
    )
    chat(
        "chat reasoning return_token_ids",
        "chat reasoning",
        _chat(structured_outputs=ANSWER, max_tokens=60, return_token_ids=True),
    )
    chat(
        "chat reasoning cut by max_tokens: no content",
        "chat reasoning",
        _chat(structured_outputs=ENDLESS_THOUGHT, max_tokens=20),
    )
    chat(
        "chat reasoning cut by max_tokens, enable_thinking, include_reasoning false, streamed",
        "chat reasoning",
        _chat(
            structured_outputs=ENDLESS_THOUGHT,
            max_tokens=20,
            include_reasoning=False,
            chat_template_kwargs=THINKING,
            stream=True,
            **usage,
        ),
    )
    chat(
        "chat reasoning continuous usage",
        "chat reasoning",
        _chat(
            structured_outputs=ANSWER,
            max_tokens=60,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
        ),
    )
    chat("chat reasoning enable_thinking, free output", "chat reasoning", _chat(chat_template_kwargs=THINKING))
    chat(
        "chat reasoning_effort high, free output, streamed",
        "chat reasoning",
        _chat(reasoning_effort="high", stream=True, **usage),
    )
    chat(
        "chat reasoning required, enable_thinking, include_reasoning false",
        "chat reasoning",
        _chat(
            tools=tools, tool_choice="required", max_tokens=60, include_reasoning=False, chat_template_kwargs=THINKING
        ),
    )
    chat("chat reasoning history with reasoning", "chat reasoning", _chat(WITH_REASONING, return_token_ids=True))
    chat(
        "chat reasoning history with reasoning and reasoning_content",
        "chat reasoning",
        _chat(
            [USER, {**ASSISTANT, "reasoning": "A.", "reasoning_content": "B."}, USER2],
            return_token_ids=True,
        ),
    )
    chat(
        "chat reasoning history with reasoning and a tool call, named",
        "chat reasoning",
        _chat(
            [
                USER,
                {"role": "assistant", "content": None, "reasoning": "Call it.", "tool_calls": [CALL]},
                {"role": "tool", "content": "42", "tool_call_id": "call_1"},
            ],
            tools=tools,
            tool_choice=NAMED,
            max_tokens=20,
            return_token_ids=True,
        ),
    )
    chat(
        "chat reasoning history reasoning not a string",
        "chat reasoning errors",
        _chat([USER, {**ASSISTANT, "reasoning": 5}, USER2]),
    )
    chat("chat reasoning include_reasoning a number", "chat reasoning errors", _chat(include_reasoning=5))
    chat(
        "chat reasoning include_reasoning a string",
        "chat reasoning errors",
        _chat(include_reasoning="no"),
        deviation="strict_types",
    )
    chat("chat reasoning_effort not one of vLLM's", "chat reasoning errors", _chat(reasoning_effort="extreme"))
    chat("chat reasoning_effort a number", "chat reasoning errors", _chat(reasoning_effort=3))
    chat(
        "chat reasoning chat_template_kwargs not an object",
        "chat reasoning errors",
        _chat(chat_template_kwargs="enable_thinking"),
    )
    batch(
        "batch chat reasoning",
        "batch chat reasoning",
        _chat([SYS_USER, [USER2]], structured_outputs=ANSWER, max_tokens=60),
        deviation="batch_chat_reasoning_tokens",
    )
    batch(
        "batch chat reasoning include_reasoning false",
        "batch chat reasoning",
        _chat([SYS_USER, [USER2]], structured_outputs=ANSWER, max_tokens=60, include_reasoning=False),
        deviation="batch_chat_reasoning_tokens",
    )
    batch(
        "batch chat tools required",
        "batch chat tools",
        _chat([SYS_USER, [USER2]], tools=tools, tool_choice="required", max_tokens=60),
        deviation="batch_chat_tools",
    )
    batch(
        "batch chat tools named",
        "batch chat tools",
        _chat([SYS_USER, [USER2]], tools=tools, tool_choice=NAMED, max_tokens=40),
        deviation="batch_chat_tools",
    )
    chat("chat tools []", "chat errors", _chat(tools=[]))
    chat(
        "chat tools with a function name that is a number",
        "chat errors",
        _chat(tools=[{"type": "function", "function": {"name": 1}}], tool_choice="none"),
    )
    chat(
        "chat history tool call arguments an object",
        "chat errors",
        _chat(_with_call(function={"name": "f", "arguments": {}})),
    )
    chat("chat history tool call without an id", "chat errors", _chat(_with_call(id=None)))
    chat(
        "chat history tool call of type custom",
        "chat errors",
        _chat([USER, {"role": "assistant", "tool_calls": [CUSTOM_CALL]}]),
    )
    chat(
        "chat history tool message with a numeric tool_call_id",
        "chat errors",
        _chat([USER, {"role": "tool", "content": "42", "tool_call_id": 7}]),
    )
    chat("chat history tool_calls a number", "chat errors", _chat([{**USER, "tool_calls": 5}]))
    chat("chat tool_choice without tools", "chat errors", _chat(tool_choice="auto"))
    chat("chat request chat_template", "chat errors", _chat(chat_template="{{ messages[0]['content'] }}"))
    chat(
        "chat chat_template in chat_template_kwargs",
        "chat errors",
        _chat(chat_template_kwargs={"chat_template": "{{ messages[0]['content'] }}"}),
    )
    chat("chat greedy n=2", "chat errors", _chat(n=2))
    chat("chat min_tokens over max_tokens", "chat errors", _chat(max_tokens=4, min_tokens=5))
    chat(
        "chat max_completion_tokens over the context",
        "chat errors",
        _chat(max_tokens=_DROP, max_completion_tokens=5000),
    )
    chat("chat conversation over the context", "chat errors", _chat(LONG))
    chat("chat seed over int64", "chat errors", _chat(seed=2**63, temperature=1.0))
    chat("chat unknown model", "chat errors", _chat(model="no-such-model"))
    chat("chat bad JSON", "chat errors", b'{"model": "braid-tiny", "messages": [')
    # -- batched chat: one choice per conversation, usage summed
    # (usage: deviation:batch_chat_reasoning_tokens, once the server has a reasoning parser)
    reasoning_tokens = "batch_chat_reasoning_tokens"
    batch("batch chat two conversations", "batch chat", _chat([SYS_USER, [USER2]]), deviation=reasoning_tokens)
    batch(
        "batch chat three conversations", "batch chat", _chat(CONVERSATIONS, max_tokens=12), deviation=reasoning_tokens
    )
    batch(
        "batch chat logprobs",
        "batch chat",
        _chat(CONVERSATIONS, logprobs=True, top_logprobs=2, max_tokens=4),
        deviation=reasoning_tokens,
    )
    batch(
        "batch chat stop, token ids, max_completion_tokens",
        "batch chat",
        _chat(
            CONVERSATIONS,
            max_tokens=_DROP,
            max_completion_tokens=20,
            ignore_eos=True,
            stop=["\n"],
            return_token_ids=True,
        ),
        deviation=reasoning_tokens,
    )
    batch(
        "batch chat echo",
        "batch chat",
        _chat([ENDS_WITH_ASSISTANT, [USER2]], add_generation_prompt=False, continue_final_message=True, echo=True),
        deviation=reasoning_tokens,
    )
    batch(
        "batch chat seeded sampling",
        "batch chat",
        _chat(CONVERSATIONS, temperature=1.0, seed=4, max_tokens=10),
        deviation=reasoning_tokens,
    )
    batch("batch chat one conversation", "batch chat", _chat([MULTI_TURN]), deviation=reasoning_tokens)
    batch(
        "batch chat tool-calling histories",
        "batch chat",
        _chat([TOOL_HISTORY, REASONING_HISTORY]),
        deviation="batch_chat_tool_history",
    )
    batch("batch chat a bad tool call", "batch chat errors", _chat([SYS_USER, _with_call(type="x")]))
    batch(
        "batch chat a numeric tool_call_id",
        "batch chat errors",
        _chat([SYS_USER, [USER, {"role": "tool", "content": "42", "tool_call_id": 7}]]),
    )
    batch("batch chat messages []", "batch chat errors", _chat([]))
    batch("batch chat an empty conversation", "batch chat errors", _chat([SYS_USER, []]))
    batch("batch chat a flat conversation", "batch chat errors", _chat(SYS_USER))
    batch(
        "batch chat tool_choice auto",
        "batch chat errors",
        _chat([SYS_USER], tool_choice="auto"),
        deviation="batch_chat_tools",
    )
    batch(
        "batch chat both template flags true",
        "batch chat errors",
        _chat([ENDS_WITH_ASSISTANT], continue_final_message=True),
    )
    batch("batch chat top_logprobs without logprobs", "batch chat errors", _chat([SYS_USER], top_logprobs=2))
    batch(
        "batch chat n=2 seeded",
        "batch chat errors",
        _chat(CONVERSATIONS, n=2, temperature=0.8, seed=6),
        deviation="batch_chat_n",
    )
    batch(
        "batch chat streamed",
        "batch chat errors",
        _chat([SYS_USER, [USER2]], stream=True, stream_options={"include_usage": True}),
        deviation="batch_chat_stream",
    )
    batch(
        "batch chat streamed n=2 seeded",
        "batch chat errors",
        _chat(CONVERSATIONS, stream=True, n=2, temperature=0.8, seed=6),
        deviation="batch_chat_stream",
    )
    # -- /tokenize (a prompt, or messages rendered by the chat template) and /detokenize
    tok = "tokenize"
    c.append(Case("tokenize a prompt", tok, {"model": MODEL, "prompt": USER["content"]}, path=TOKENIZE))
    c.append(
        Case(
            "tokenize a prompt without special tokens, with token strings",
            tok,
            {"model": MODEL, "prompt": USER2["content"], "add_special_tokens": False, "return_token_strs": True},
            path=TOKENIZE,
        )
    )
    c.append(Case("tokenize messages", tok, {"model": MODEL, "messages": MULTI_TURN}, path=TOKENIZE))
    c.append(
        Case(
            "tokenize messages with token strings, no generation prompt",
            tok,
            {"model": MODEL, "messages": TEXT_PARTS, "add_generation_prompt": False, "return_token_strs": True},
            path=TOKENIZE,
        )
    )
    c.append(
        Case(
            "tokenize messages continue_final_message",
            tok,
            {
                "model": MODEL,
                "messages": ENDS_WITH_ASSISTANT,
                "add_generation_prompt": False,
                "continue_final_message": True,
                "add_special_tokens": True,
            },
            path=TOKENIZE,
        )
    )
    c.append(Case("tokenize messages []", tok, {"model": MODEL, "messages": []}, path=TOKENIZE))
    c.append(
        Case(
            "tokenize messages with tool calls and tools",
            tok,
            {"model": MODEL, "messages": TOOL_HISTORY, "tools": [TOOL]},
            path=TOKENIZE,
        )
    )
    c.append(
        Case(
            "tokenize messages with a bad tool call",
            tok,
            {"model": MODEL, "messages": _with_call(function={"name": "f"})},
            path=TOKENIZE,
        )
    )
    c.append(
        Case(
            "tokenize messages with a bad tool call, unknown model",
            tok,
            {"model": "no-such-model", "messages": _with_call(function={"name": "f"})},
            path=TOKENIZE,
        )
    )
    c.append(
        Case(
            "tokenize messages with both template flags true",
            tok,
            {"model": MODEL, "messages": ENDS_WITH_ASSISTANT, "continue_final_message": True},
            path=TOKENIZE,
        )
    )
    c.append(
        Case(
            "tokenize messages with a request chat_template",
            tok,
            {"model": MODEL, "messages": [USER], "chat_template": "{{ messages[0]['content'] }}"},
            path=TOKENIZE,
        )
    )
    c.append(Case("tokenize neither prompt nor messages", tok, {"model": MODEL}, path=TOKENIZE))
    c.append(Case("tokenize unknown model", tok, {"model": "no-such-model", "prompt": "x"}, path=TOKENIZE))
    c.append(Case("detokenize", tok, {"model": MODEL, "tokens": [300, 301, 302, 303, 304]}, path=DETOKENIZE))
    c.append(Case("detokenize special tokens", tok, {"model": MODEL, "tokens": [1, 300, 2, 301]}, path=DETOKENIZE))
    c.append(Case("detokenize []", tok, {"model": MODEL, "tokens": []}, path=DETOKENIZE))
    c.append(Case("detokenize a negative id", tok, {"model": MODEL, "tokens": [5, -1]}, path=DETOKENIZE))
    c.append(
        Case(
            "detokenize an out-of-vocabulary id",
            tok,
            {"model": MODEL, "tokens": [5, 999999]},
            path=DETOKENIZE,
            deviation="detokenize_vocabulary",
        )
    )
    return c
