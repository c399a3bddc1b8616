"""POST /tokenize and /detokenize of braid on vLLM (the tiny model, which has a chat template).

The expected ids are what vLLM 0.32's own server computes, with the same Hugging Face tokenizer:
a text is ``encode(text)``; a conversation is ``apply_chat_template(..., tokenize=False)`` then
``encode(add_special_tokens=False)``; ``token_strs`` is ``convert_ids_to_tokens``; a decode keeps
the special tokens."""

from __future__ import annotations

from typing import Any

import httpx
import msgspec
import pytest

from braid.wire import shapes as responses
from tests.helpers import VllmServer
from tools.servers import tiny_model_dir

pytestmark = pytest.mark.vllm

CHAT = [{"role": "user", "content": "Hi there"}]
TEXT = "Hello world, naïve café 東京 🙂\n\tdef f(x): return x"


@pytest.fixture(scope="module")
def hf() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir())


def post(server: VllmServer, path: str, body: object) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=30)


def ok(server: VllmServer, path: str, body: object) -> Any:
    r = post(server, path, body)
    assert r.status_code == 200, r.text
    msgspec.json.decode(r.content, type=responses.Tokenize if path == "/tokenize" else responses.Detokenize)
    return r.json()


def chat_ids(hf: Any, messages: list[dict[str, Any]], **flags: bool) -> list[int]:
    text = hf.apply_chat_template(messages, tokenize=False, **flags)
    return list(hf.encode(text, add_special_tokens=False))


def test_a_text(vllm_server: VllmServer, hf: Any) -> None:
    ids = list(hf.encode(TEXT))
    assert ok(vllm_server, "/tokenize", {"model": vllm_server.model, "prompt": TEXT}) == {
        "count": len(ids),
        "max_model_len": 1024,
        "tokens": ids,
        "token_strs": None,
    }
    data = ok(vllm_server, "/tokenize", {"prompt": TEXT, "add_special_tokens": False, "return_token_strs": True})
    assert data["tokens"] == ids[1:]  # no BOS
    assert data["token_strs"] == hf.convert_ids_to_tokens(ids[1:])  # "Ġworld", not " world"


def test_a_conversation(vllm_server: VllmServer, hf: Any) -> None:
    data = ok(vllm_server, "/tokenize", {"messages": CHAT, "return_token_strs": True})
    assert data["tokens"] == chat_ids(hf, CHAT, add_generation_prompt=True)
    assert data["token_strs"] == hf.convert_ids_to_tokens(data["tokens"])
    assert data["count"] == len(data["tokens"])
    body = {"messages": CHAT, "add_generation_prompt": False}
    assert ok(vllm_server, "/tokenize", body)["tokens"] == chat_ids(hf, CHAT, add_generation_prompt=False)
    two = [*CHAT, {"role": "assistant", "content": "Sure, here"}]
    body = {"messages": two, "add_generation_prompt": False, "continue_final_message": True}
    assert ok(vllm_server, "/tokenize", body)["tokens"] == chat_ids(
        hf, two, add_generation_prompt=False, continue_final_message=True
    )
    with_bos = ok(vllm_server, "/tokenize", {"messages": CHAT, "add_special_tokens": True})["tokens"]
    assert with_bos == [hf.bos_token_id, *chat_ids(hf, CHAT, add_generation_prompt=True)]


def test_tokenize_then_detokenize(vllm_server: VllmServer, hf: Any) -> None:
    ids = ok(vllm_server, "/tokenize", {"prompt": TEXT, "add_special_tokens": False})["tokens"]
    assert ok(vllm_server, "/detokenize", {"tokens": ids}) == {"prompt": TEXT}
    ids = ok(vllm_server, "/tokenize", {"messages": CHAT})["tokens"]
    assert ok(vllm_server, "/detokenize", {"tokens": ids}) == {"prompt": hf.decode(ids)}
    # special tokens are spelled out; the last id of the vocabulary decodes
    special = [hf.bos_token_id, hf.eos_token_id, 2047]
    assert ok(vllm_server, "/detokenize", {"tokens": special}) == {"prompt": hf.decode(special)}
    assert ok(vllm_server, "/detokenize", {"tokens": []}) == {"prompt": ""}


@pytest.mark.parametrize(
    ("path", "body", "status", "kind", "param"),
    [
        ("/tokenize", {"prompt": "x", "model": "nope"}, 404, "NotFoundError", "model"),
        ("/detokenize", {"tokens": [1], "model": "nope"}, 404, "NotFoundError", "model"),
        ("/tokenize", {"messages": []}, 400, "BadRequestError", None),
        ("/tokenize", {"messages": CHAT, "continue_final_message": True}, 400, "BadRequestError", None),
        ("/tokenize", {"messages": CHAT, "chat_template": "{{ 1 }}"}, 400, "BadRequestError", None),
        ("/tokenize", {"messages": [{"content": "x"}]}, 400, "Bad Request", "body.prompt"),
        ("/tokenize", {}, 400, "Bad Request", "body.prompt"),
        ("/detokenize", {"tokens": [-1]}, 400, "Bad Request", "body.tokens.0"),
        # braid: an id outside the vocabulary is a 400 (vLLM decodes it as nothing)
        ("/detokenize", {"tokens": [2048]}, 400, "BadRequestError", "tokens"),
        ("/detokenize", {"tokens": [1] * 4097}, 400, "BadRequestError", "tokens"),
    ],
)
def test_errors(vllm_server: VllmServer, path: str, body: object, status: int, kind: str, param: str | None) -> None:
    r = post(vllm_server, path, body)
    assert r.status_code == status, r.text
    error = msgspec.json.decode(r.content, type=responses.Error).error
    assert (error.type, error.param, error.code) == (kind, param, status), error.message


def test_a_large_text_and_id_list(vllm_server: VllmServer, hf: Any) -> None:
    text = TEXT * 400  # ~20k characters: tokenized on braid's tokenizing thread
    data = ok(vllm_server, "/tokenize", {"prompt": text, "add_special_tokens": False, "return_token_strs": True})
    assert data["tokens"] == list(hf.encode(text, add_special_tokens=False))
    assert data["token_strs"] == hf.convert_ids_to_tokens(data["tokens"])
    ids = data["tokens"][:4096]
    assert ok(vllm_server, "/detokenize", {"tokens": ids}) == {"prompt": hf.decode(ids)}
