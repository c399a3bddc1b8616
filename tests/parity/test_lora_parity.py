"""LoRA against vLLM's own server serving the same adapter: a LoRA braid of this module's own
(``lora_server`` here; the same flags as tests/conftest.py's) beside ``vllm serve --enable-lora --lora-modules tiny-lora=PATH`` with
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``, one of each, on the same engine settings and seed.

The cases run in one test, in order, because the load and unload cases change what both servers
serve; each is recorded in the parity table like the matrix's. No case asks for prompt logprobs:
with LoRA on, vLLM's CPU build dies on them (tests/vllm/test_lora.py).

Why this module starts its own braid instead of the session's: once a second adapter has been
loaded, used and unloaded, vLLM 0.32's CPU build computes wrong output for a step that mixes base
and adapter requests, on vLLM's own server as on braid (docs/compatibility.md, LoRA); the vLLM
tier's mixed-batch test must see an engine that has only ever held its one adapter.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import LORA_ADAPTER, LORA_FLAGS
from tests.parity.client import send
from tests.parity.compare import Reply, diff, view
from tests.parity.matrix import MODEL, TEXT, TEXT2, Case
from tests.parity.report import RESULTS, Result
from tools.servers import ServerProcess, run_braid, run_vllm, tiny_model_dir

pytestmark = pytest.mark.vllm

LOADED = "tiny-lora-b"
CHAT = [{"role": "user", "content": "Write a function."}]


@pytest.fixture(scope="module")
def lora_server(lora_adapter: Path) -> Iterator[ServerProcess]:
    log = Path(os.environ.get("BRAID_PARITY_LORA_LOG", "/tmp/braid-parity-lora.log"))
    flags = (*LORA_FLAGS, "--allow-runtime-lora-updating", "--lora-modules", f"{LORA_ADAPTER}={lora_adapter}")
    with run_braid(*flags, seed=0, log=log) as server:
        yield server


@pytest.fixture(scope="module")
def vllm_lora(lora_adapter: Path, lora_server: ServerProcess) -> Iterator[ServerProcess]:
    # After braid's: it builds the model and adapter both then serve.
    log = Path(os.environ.get("BRAID_VLLM_LORA_LOG", "/tmp/braid-parity-vllm-lora.log"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "1")  # the child server's environment
        flags = (*LORA_FLAGS, "--lora-modules", f"{LORA_ADAPTER}={lora_adapter}")
        with run_vllm(*flags, model_dir=tiny_model_dir(), seed=0, log=log) as server:
            yield server


def _req(**fields: Any) -> dict[str, Any]:
    return {"model": LORA_ADAPTER, "max_tokens": 8, "temperature": 0, **fields}


def _cards(reply: Reply) -> Any:
    """What /v1/models says of each model: owned_by and permission are braid's own (docs/compatibility.md)."""
    if reply.status != 200:
        return view(reply)
    return [(c["id"], c["object"], c["parent"], c["root"], c["max_model_len"]) for c in reply.body["data"]]


def _cases(adapter: str) -> list[Case]:
    def case(name: str, body: Any, path: str = "/v1/completions", method: str = "POST") -> Case:
        return Case(name, "lora", body, path=path, method=method)

    load, unload = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"
    return [
        case("lora: /v1/models lists the adapter", None, "/v1/models", "GET"),
        case("lora: completion", _req(prompt=TEXT)),
        case("lora: completion, streamed", _req(prompt=TEXT, stream=True, stream_options={"include_usage": True})),
        case("lora: batch of prompts", _req(prompt=[TEXT, TEXT2])),
        case("lora: chat", _req(messages=CHAT), "/v1/chat/completions"),
        case("lora: chat, streamed", _req(messages=CHAT, stream=True), "/v1/chat/completions"),
        case("lora: tokenize with the adapter's name", {"model": LORA_ADAPTER, "prompt": TEXT}, "/tokenize"),
        case("lora: the base model beside the adapter", _req(prompt=TEXT, model=MODEL)),
        case("lora: unknown adapter", _req(prompt=TEXT, model="tiny-lora-2")),
        case("lora: load", {"lora_name": LOADED, "lora_path": adapter}, load),
        case("lora: /v1/models lists the loaded adapter", None, "/v1/models", "GET"),
        case("lora: completion with the loaded adapter", _req(prompt=TEXT, model=LOADED)),
        case("lora: load again", {"lora_name": LOADED, "lora_path": adapter}, load),
        case("lora: load a path with no adapter", {"lora_name": "tiny-lora-c", "lora_path": "/no/adapter"}, load),
        case("lora: load under the model's name", {"lora_name": MODEL, "lora_path": adapter}, load),
        case("lora: load without a name", {"lora_name": "", "lora_path": adapter}, load),
        case("lora: load without lora_path", {"lora_name": "tiny-lora-c"}, load),
        case("lora: unload", {"lora_name": LOADED}, unload),
        case("lora: completion with the unloaded adapter", _req(prompt=TEXT, model=LOADED)),
        case("lora: /v1/models after the unload", None, "/v1/models", "GET"),
        case("lora: unload unknown", {"lora_name": LOADED}, unload),
    ]


def test_lora_cases_match_vllm(lora_server: ServerProcess, vllm_lora: ServerProcess, lora_adapter: Path) -> None:
    failures = []
    with httpx.Client(timeout=300) as http:
        for case in _cases(str(lora_adapter)):
            braid, vllm = send(http, lora_server.url, case), send(http, vllm_lora.url, case)
            if case.path == "/v1/models":
                problems = diff(_cards(braid), _cards(vllm))
            else:
                problems = diff(view(braid), view(vllm))
            RESULTS.append(Result(case.name, case.group, "mismatch" if problems else "match", "; ".join(problems[:3])))
            failures += [f"{case.name}: {p}" for p in problems[:5]]
    assert not failures, "\n".join(failures)


def test_lora_requests_info_is_vllms(lora_server: ServerProcess, vllm_lora: ServerProcess) -> None:
    from tests.vllm.test_vllm_metrics import families

    for server in (lora_server, vllm_lora):
        body = _req(prompt=TEXT, max_tokens=4)
        assert httpx.post(server.url + "/v1/completions", json=body, timeout=60).status_code == 200
    ours, theirs = families(lora_server.url), families(vllm_lora.url)
    assert ours["vllm:lora_requests_info"] == theirs["vllm:lora_requests_info"] is not None
