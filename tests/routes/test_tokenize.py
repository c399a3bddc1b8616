"""POST /tokenize and /detokenize through real hypercorn, on the scripted engine (byte tokens:
``<s>`` is 0, ``</s>`` 1, ``<pad>`` 2, byte ``b`` is ``b + 3``). The answers and errors expected
here are vLLM 0.32's on the same bodies, except where a comment says braid differs."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import msgspec
import pytest
import trio

from braid.engine.scripted import ByteTokenizer
from braid.stream.tokenize import INLINE_CHARS
from braid.wire import shapes as responses
from tests.helpers import LiveServer, RecordingTokenizer, start_server

pytestmark = pytest.mark.usefixtures("server")

CHAT = [{"role": "user", "content": "Hi"}]
TOK = ByteTokenizer()


def rendered(text: str) -> list[int]:
    return TOK.encode(text, add_special_tokens=False)


async def ok(client: httpx.AsyncClient, path: str, body: object) -> Any:
    r = await client.post(path, json=body)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    kind = responses.Tokenize if path == "/tokenize" else responses.Detokenize
    msgspec.json.decode(r.content, type=kind)  # exactly the declared fields
    return r.json()


async def test_a_text(client: httpx.AsyncClient) -> None:
    assert await ok(client, "/tokenize", {"prompt": "Hi"}) == {
        "count": 3,
        "max_model_len": 2048,
        "tokens": [0, 75, 108],
        "token_strs": None,
    }
    data = await ok(client, "/tokenize", {"model": "scripted", "prompt": "Hi é", "add_special_tokens": False})
    assert data["tokens"] == rendered("Hi é") and data["count"] == 5 and data["token_strs"] is None
    data = await ok(client, "/tokenize", {"prompt": "Hi é", "return_token_strs": True})
    assert data["token_strs"] == ["<s>", "H", "i", " ", "<0xC3>", "<0xA9>"]  # the vocabulary's spellings
    assert (await ok(client, "/tokenize", {"prompt": "", "return_token_strs": None}))["tokens"] == [0]
    # unknown fields are ignored; a null model is the served one
    assert (await ok(client, "/tokenize", {"prompt": "a", "model": None, "extra": 1}))["tokens"] == [0, 100]


async def test_a_conversation_is_rendered_by_the_chat_template(client: httpx.AsyncClient) -> None:
    data = await ok(client, "/tokenize", {"messages": CHAT})
    assert data["tokens"] == rendered("<|user|>\nHi</s>\n<|assistant|>\n") and data["count"] == len(data["tokens"])
    data = await ok(client, "/tokenize", {"messages": CHAT, "add_generation_prompt": False, "return_token_strs": True})
    assert data["tokens"] == rendered("<|user|>\nHi</s>\n")
    assert "".join(data["token_strs"]) == "<|user|><0x0A>Hi</s><0x0A>"
    two = [*CHAT, {"role": "assistant", "content": "Sure"}]
    body = {"messages": two, "continue_final_message": True, "add_generation_prompt": False}
    assert (await ok(client, "/tokenize", body))["tokens"] == rendered("<|user|>\nHi</s>\n<|assistant|>\nSure")
    # add_special_tokens: the tokenizer's BOS on top of what the template writes
    assert (await ok(client, "/tokenize", {"messages": CHAT, "add_special_tokens": True}))["tokens"][:2] == [0, 63]
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert (await ok(client, "/tokenize", {"messages": parts}))["tokens"] == rendered(
        "<|user|>\na\nb</s>\n<|assistant|>\n"
    )
    # a message without content renders as empty; template variables are taken, and tools reach the
    # template as vLLM dumps them (the scripted format writes them first, one JSON line each)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    body = {"messages": [{"role": "user"}], "chat_template_kwargs": {"x": 1}, "tools": tools}
    dumped = '{"type": "function", "function": {"name": "f", "description": null, "parameters": {}}}'
    assert (await ok(client, "/tokenize", body))["tokens"] == rendered(
        f"<|tools|>\n{dumped}\n</s>\n<|user|>\n</s>\n<|assistant|>\n"
    )
    plain = await ok(client, "/tokenize", {"messages": CHAT})
    assert await ok(client, "/tokenize", {"messages": CHAT, "tools": []}) == plain


async def test_the_form_is_chosen_as_vllms_union_does(client: httpx.AsyncClient) -> None:
    chat = rendered("<|user|>\nHi</s>\n<|assistant|>\n")
    # both: the conversation; a conversation that is not one, with a valid text: the text
    assert (await ok(client, "/tokenize", {"messages": CHAT, "prompt": "x"}))["tokens"] == chat
    assert (await ok(client, "/tokenize", {"messages": "hi", "prompt": "x"}))["tokens"] == [0, 123]
    assert (await ok(client, "/tokenize", {"messages": None, "prompt": "x"}))["tokens"] == [0, 123]


async def test_detokenize_spells_special_tokens_out(client: httpx.AsyncClient) -> None:
    assert await ok(client, "/detokenize", {"tokens": [0, 75, 108, 1, 2]}) == {"prompt": "<s>Hi</s><pad>"}
    assert await ok(client, "/detokenize", {"tokens": [], "model": "scripted"}) == {"prompt": ""}


@pytest.mark.parametrize("text", ["Hello, world!", "naïve café 東京 🙂\n\tend", ""])
async def test_tokenize_then_detokenize_is_the_text(client: httpx.AsyncClient, text: str) -> None:
    tokens = (await ok(client, "/tokenize", {"prompt": text, "add_special_tokens": False}))["tokens"]
    assert await ok(client, "/detokenize", {"tokens": tokens}) == {"prompt": text}
    tokens = (await ok(client, "/tokenize", {"prompt": text}))["tokens"]
    assert await ok(client, "/detokenize", {"tokens": tokens}) == {"prompt": "<s>" + text}


LONG = 4 * 2048 + 1
ERRORS: list[tuple[str, object, int, str, str | None]] = [
    # (route, body, status, error.type, error.param): vLLM 0.32's answer unless marked
    ("/tokenize", {}, 400, "Bad Request", "body.prompt"),
    ("/tokenize", [], 400, "Bad Request", "body"),
    ("/tokenize", {"prompt": 3}, 400, "Bad Request", "body.prompt"),
    ("/tokenize", {"prompt": ["a", "b"]}, 400, "Bad Request", "body.prompt"),
    ("/tokenize", {"prompt": None}, 400, "Bad Request", "body.prompt"),
    ("/tokenize", {"prompt": "x", "return_token_strs": "no"}, 400, "Bad Request", "body.return_token_strs"),
    # braid: strict types (vLLM coerces "yes" and 1 to true)
    ("/tokenize", {"prompt": "x", "add_special_tokens": "yes"}, 400, "Bad Request", "body.add_special_tokens"),
    ("/tokenize", {"prompt": "x", "model": "nope"}, 404, "NotFoundError", "model"),
    ("/tokenize", {"messages": CHAT, "model": "nope"}, 404, "NotFoundError", "model"),
    ("/tokenize", {"messages": [], "model": "nope"}, 404, "NotFoundError", "model"),
    ("/tokenize", {"messages": []}, 400, "BadRequestError", None),
    ("/tokenize", {"messages": CHAT, "continue_final_message": True}, 400, "BadRequestError", None),
    (
        "/tokenize",
        {"messages": CHAT, "continue_final_message": True, "add_generation_prompt": True, "model": "nope"},
        400,
        "BadRequestError",
        None,
    ),
    ("/tokenize", {"messages": CHAT, "chat_template": "{{ 1 }}"}, 400, "BadRequestError", None),
    ("/tokenize", {"messages": CHAT, "chat_template_kwargs": {"chat_template": "x"}}, 400, "BadRequestError", None),
    # a body that is neither form: located where the text form's first fault is, as vLLM does
    ("/tokenize", {"messages": "hi"}, 400, "Bad Request", "body.prompt"),
    ("/tokenize", {"messages": [{"content": "x"}]}, 400, "Bad Request", "body.prompt"),
    ("/tokenize", {"messages": [{"role": "user", "content": 5}]}, 400, "Bad Request", "body.prompt"),
    ("/tokenize", {"messages": CHAT, "chat_template_kwargs": "x"}, 400, "Bad Request", "body.prompt"),
    ("/tokenize", {"messages": CHAT, "tools": [{"bad": 1}]}, 400, "Bad Request", "body.prompt"),
    ("/tokenize", {"messages": CHAT, "add_generation_prompt": None}, 400, "Bad Request", "body.prompt"),
    ("/tokenize", {"messages": CHAT, "prompt": 1, "tools": 2}, 400, "Bad Request", "body.prompt"),
    ("/detokenize", {}, 400, "Bad Request", "body.tokens"),
    ("/detokenize", {"tokens": None}, 400, "Bad Request", "body.tokens"),
    ("/detokenize", {"tokens": "1"}, 400, "Bad Request", "body.tokens"),
    ("/detokenize", {"tokens": [1, -1]}, 400, "Bad Request", "body.tokens.1"),
    ("/detokenize", {"tokens": [2**63]}, 400, "Bad Request", "body.tokens.0"),
    # braid: strict types (vLLM decodes 1.0, "1" and true as 1)
    ("/detokenize", {"tokens": [1.0]}, 400, "Bad Request", "body.tokens.0"),
    ("/detokenize", {"tokens": [True]}, 400, "Bad Request", "body.tokens.0"),
    ("/detokenize", {"tokens": [1], "model": "nope"}, 404, "NotFoundError", "model"),
    # braid: an id outside the vocabulary is refused (vLLM decodes one below 2**32 as nothing,
    # and refuses one above with param null); so is a list longer than 4 contexts
    ("/detokenize", {"tokens": [75, 259]}, 400, "BadRequestError", "tokens"),
    ("/detokenize", {"tokens": [2**32]}, 400, "BadRequestError", "tokens"),
    ("/detokenize", {"tokens": [3] * LONG}, 400, "BadRequestError", "tokens"),
]


@pytest.mark.parametrize(("path", "body", "status", "kind", "param"), ERRORS)
async def test_errors(
    client: httpx.AsyncClient, path: str, body: object, status: int, kind: str, param: str | None
) -> None:
    r = await client.post(path, json=body)
    assert r.status_code == status, r.text
    error = msgspec.json.decode(r.content, type=responses.Error).error
    assert (error.type, error.param, error.code) == (kind, param, status), error.message
    assert error.message


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
async def test_the_body_must_be_json(client: httpx.AsyncClient, path: str) -> None:
    r = await client.post(path, content=b'{"prompt": "x", "tokens": []}')  # no content type
    assert r.status_code == 400 and r.json()["error"]["type"] == "Bad Request"
    assert "Unsupported Media Type" in r.json()["error"]["message"]
    r = await client.post(path, content=b'{"prompt": ', headers={"Content-Type": "application/json"})
    assert (r.status_code, r.json()["error"]["param"]) == (400, "body.11")
    r = await client.get(path)
    assert r.status_code == 405 and "POST" in r.headers["allow"]


async def test_a_request_template_with_the_flag(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery, trust_request_chat_template=True)
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as c:
        # the scripted engine renders only its own format: its refusal is the engine's 400
        r = await c.post("/tokenize", json={"messages": CHAT, "chat_template": "{{ 1 }}"})
        assert (r.status_code, r.json()["error"]["param"]) == (400, "chat_template")
        r = await c.post("/tokenize", json={"messages": CHAT, "chat_template_kwargs": {"chat_template": "{{ 1 }}"}})
        assert (r.status_code, r.json()["error"]["param"]) == (400, "chat_template")
    srv.shutdown.set()


async def test_answered_while_the_engine_is_down(client: httpx.AsyncClient, server: LiveServer) -> None:
    server.engine.healthy = False  # the tokenizer is braid's own: no engine request is made
    assert (await ok(client, "/tokenize", {"prompt": "a"}))["tokens"] == [0, 100]
    assert await ok(client, "/detokenize", {"tokens": [100]}) == {"prompt": "a"}
    server.engine.healthy = True


class _DecodeWhere(RecordingTokenizer):
    def decode(self, token_ids: tuple[int, ...] | list[int], *, skip_special_tokens: bool = True) -> str:
        self.threads.append("decode:" + self._where())
        return super().decode(token_ids, skip_special_tokens=skip_special_tokens)


async def test_a_large_body_is_worked_off_the_trio_thread(client: httpx.AsyncClient, server: LiveServer) -> None:
    tok = _DecodeWhere()
    server.engine.tokenizer = tok
    text = "abc " * (INLINE_CHARS // 4 + 1)
    data = await ok(client, "/tokenize", {"prompt": text, "return_token_strs": True})
    assert data["count"] == len(text) + 1 and len(data["token_strs"]) == data["count"]
    chat = await ok(client, "/tokenize", {"messages": [{"role": "user", "content": text}]})
    assert chat["count"] == len(rendered(f"<|user|>\n{text}</s>\n<|assistant|>\n"))
    ids = data["tokens"][1:8001]  # over INLINE_CHARS bytes of JSON, within 4 contexts
    assert await ok(client, "/detokenize", {"tokens": ids}) == {"prompt": text[:8000]}
    assert tok.threads == ["many:worker", "many:worker", "decode:worker"]
    tok.threads.clear()
    await ok(client, "/tokenize", {"prompt": "small"})
    await ok(client, "/tokenize", {"messages": CHAT})
    await ok(client, "/detokenize", {"tokens": [100]})
    assert tok.threads == ["inline", "inline", "decode:inline"]


async def test_the_request_timeout_bounds_a_large_body(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery, request_timeout=0.2)
    gate = threading.Event()
    srv.engine.tokenizer = RecordingTokenizer(gate)  # its encode_many waits for the gate
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as c:
        got: list[httpx.Response] = []

        async def post() -> None:
            got.append(await c.post("/tokenize", json={"prompt": "x" * (INLINE_CHARS + 1)}))

        async with trio.open_nursery() as n:
            n.start_soon(post)
            await trio.sleep(0.5)  # the Trio thread serves on while the tokenizing thread waits
            assert (await c.post("/tokenize", json={"prompt": "y"})).status_code == 200
            gate.set()
        (r,) = got
        assert r.status_code == 408 and r.json()["error"]["type"] == "RequestTimeout"
    srv.shutdown.set()


async def test_a_key_is_needed(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery, api_keys=("k",))
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as c:
        for path, body in (("/tokenize", {"prompt": "a"}), ("/detokenize", {"tokens": [100]})):
            r = await c.post(path, json=body)
            assert r.status_code == 401 and r.json()["error"]["type"] == "Unauthorized"
            r = await c.post(path, json=body, headers={"Authorization": "Bearer k"})
            assert r.status_code == 200, r.text
    srv.shutdown.set()
