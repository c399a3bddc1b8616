"""Chat's output (braid.routes.chat's merger and collector: the shared braid.stream.merge over
braid.wire.chat_response): chat's streamed and non-streamed bodies, fed by the real ScriptedEngine.

Expected texts and token counts come from the engine's own outputs, never from braid's rendering.
"""

from __future__ import annotations

import json

import pytest

from braid.engine.scripted import ScriptedEngine
from braid.errors import EngineError
from braid.routes import chat as chat_route
from braid.stream.merge import Phase, ProtocolViolation
from braid.stream.plan import Plan, make_plan
from braid.wire.chat_request import parse_chat
from braid.wire.chat_response import ChatShape
from braid.wire.completions_request import TextPrompt, build_request
from braid.wire.messages import render
from tests.helpers import LIMITS, TOK, generate, interleave, parse_sse

USER = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
CONT = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}]


def chat_plan(body: dict, *, stream: bool, batch: bool = False) -> tuple[Plan, ChatShape]:
    body = {**body, "stream": stream}
    if not stream:
        body.pop("stream_options", None)
    engine = ScriptedEngine()
    chat = parse_chat(json.dumps(body).encode(), LIMITS, max_model_len=engine.info.max_model_len, batch=batch)
    texts = tuple(render(TOK, c, chat.template) for c in chat.conversations)
    req = build_request(chat.body, tuple(TextPrompt(t) for t in texts), LIMITS, chat.structured)
    plan = make_plan(req, engine.info, engine.tokenizer, request_id="chatcmpl-t", created=1)
    return plan, chat_route.chat_shape(chat)


async def stream(body: dict, seed: int = 0, batch: bool = False) -> tuple[Plan, list, list]:
    plan, shape = chat_plan(body, stream=True, batch=batch)
    per_prompt = await generate(plan)
    merger = chat_route.merger(plan, TOK, shape)
    raw = b"".join(merger.feed(b) for b in interleave(per_prompt, seed)) + merger.finish()
    assert merger.phase is Phase.DONE
    return plan, per_prompt, parse_sse(raw)


async def whole(body: dict, seed: int = 0, batch: bool = False) -> tuple[Plan, list, dict]:
    plan, shape = chat_plan(body, stream=False, batch=batch)
    per_prompt = await generate(plan)
    collector = chat_route.collector(plan, TOK, shape)
    for b in interleave(per_prompt, seed):
        collector.feed(b)
    return plan, per_prompt, json.loads(collector.body())


def engine_texts(plan: Plan, per_prompt: list) -> dict[int, str]:
    out: dict[int, str] = {}
    for i, outputs in enumerate(per_prompt):
        for o in outputs:
            for d in o.choices:
                out[i * plan.n + d.index] = out.get(i * plan.n + d.index, "") + d.text
    return out


BODIES = {
    "one": ({"messages": USER, "max_tokens": 6}, False),
    "n3": ({"messages": USER, "max_tokens": 6, "n": 3, "temperature": 1, "seed": 4}, False),
    "echo": ({"messages": CONT, "max_tokens": 4, "echo": True, "add_generation_prompt": False}, False),
    "batch": ({"messages": [USER, CONT, [{"role": "user", "content": "q"}]], "max_tokens": 5}, True),
    "batch_n2": ({"messages": [USER, CONT], "max_tokens": 5, "n": 2, "temperature": 1}, True),
}


@pytest.mark.parametrize("name", BODIES)
@pytest.mark.parametrize("seed", [0, 1, 2])
async def test_every_choice_gets_its_role_then_its_content(name: str, seed: int) -> None:
    body, batch = BODIES[name]
    plan, per_prompt, events = await stream({**body, "stream_options": {"include_usage": True}}, seed, batch)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    usage = events[-2]
    assert usage["choices"] == [] and usage["object"] == "chat.completion.chunk"
    seen_role: set[int] = set()
    content: dict[int, str] = {}
    finishes: dict[int, int] = {}
    for e in events[:-2]:
        (choice,) = e["choices"]  # one choice per chunk
        i = choice["index"]
        if "role" in choice["delta"]:
            assert i not in seen_role and i not in content, "one role chunk per choice, before its content"
            assert choice["delta"] == {"role": "assistant", "content": ""}
            seen_role.add(i)
            continue
        assert i in seen_role
        content[i] = content.get(i, "") + choice["delta"]["content"]
        if choice["finish_reason"] is not None:
            finishes[i] = finishes.get(i, 0) + 1
    assert seen_role == set(range(plan.num_choices)) == set(finishes) and set(finishes.values()) == {1}
    echo = "Hel" if name == "echo" else ""  # the only body that asks for it
    expected = engine_texts(plan, per_prompt)
    assert content == {i: echo + text for i, text in expected.items()}
    completion = sum(len(d.token_ids) for outs in per_prompt for o in outs for d in o.choices)
    prompt_tokens = sum(len(item.request.prompt_token_ids) for item in plan.items)  # once per conversation
    assert usage["usage"] == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
    }


@pytest.mark.parametrize("name", BODIES)
async def test_the_non_streamed_body_holds_what_the_stream_did(name: str) -> None:
    body, batch = BODIES[name]
    plan, per_prompt, events = await stream(body, 0, batch)
    _, _, resp = await whole(body, 0, batch)
    streamed: dict[int, str] = {}
    for e in events[:-1]:
        (c,) = e["choices"]
        streamed[c["index"]] = streamed.get(c["index"], "") + c["delta"]["content"]
    assert resp["object"] == "chat.completion"
    assert [c["index"] for c in resp["choices"]] == list(range(plan.num_choices))
    assert {c["index"]: c["message"]["content"] for c in resp["choices"]} == streamed
    assert all(c["message"]["role"] == "assistant" for c in resp["choices"])
    completion = sum(len(d.token_ids) for outs in per_prompt for o in outs for d in o.choices)
    assert resp["usage"]["completion_tokens"] == completion


async def test_echo_chunks_follow_every_role_chunk() -> None:
    _, _, events = await stream(
        {"messages": CONT, "max_tokens": 3, "n": 2, "temperature": 1, "echo": True, "add_generation_prompt": False}
    )
    first = [e["choices"][0]["delta"] for e in events[:4]]
    assert first == [{"role": "assistant", "content": ""}] * 2 + [{"content": "Hel"}] * 2


async def test_chat_logprobs_list_the_sampled_token_first() -> None:
    _, per_prompt, resp = await whole({"messages": USER, "max_tokens": 4, "logprobs": True, "top_logprobs": 2})
    (choice,) = resp["choices"]
    entries = choice["logprobs"]["content"]
    tokens = [t for o in per_prompt[0] for d in o.choices for t in d.token_ids]
    assert len(entries) == len(tokens)
    for e in entries:
        assert len(e["top_logprobs"]) == 2 and e["top_logprobs"][0]["token"] == e["token"]
        assert e["bytes"] == list(e["token"].encode())
    _, _, resp = await whole({"messages": USER, "max_tokens": 4})
    assert resp["choices"][0]["logprobs"] is None


async def test_continuous_usage_counts_per_choice() -> None:
    plan, _, events = await stream(
        {
            "messages": USER,
            "max_tokens": 4,
            "n": 2,
            "temperature": 1,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
    )
    prompt = len(plan.items[0].request.prompt_token_ids)
    roles = [e for e in events[:-2] if "role" in e["choices"][0]["delta"]]
    assert all(e["usage"]["completion_tokens"] == 0 and e["usage"]["prompt_tokens"] == prompt for e in roles)
    last = {}
    for e in events[:-2]:
        last[e["choices"][0]["index"]] = e["usage"]["completion_tokens"]
    assert sum(last.values()) == events[-2]["usage"]["completion_tokens"]


async def test_an_error_ends_the_stream_and_nothing_follows() -> None:
    plan, shape = chat_plan({"messages": USER, "max_tokens": 4}, stream=True)
    merger = chat_route.merger(plan, TOK, shape)
    raw = merger.fail(EngineError("boom"))
    assert parse_sse(raw)[-1] == "[DONE]" and b'"error"' in raw
    with pytest.raises(ProtocolViolation):
        merger.feed([])
