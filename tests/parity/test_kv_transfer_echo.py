"""``kv_transfer_params`` in responses, against vLLM's own server: both run the engine with a KV
connector (tools/kv_echo.py, loaded by vLLM from its module path as any out-of-tree connector),
which hands back, when a request ends, what the request's ``kv_transfer_params`` asked it to.

vLLM 0.32 puts the first prompt's value (``RequestOutput.kv_transfer_params``) in a non-streamed
completions or chat body, and in nothing else: not in a stream, not in a batch chat body. braid's
answers must be vLLM's, whole (tests/parity/compare.py's normalisation), on each of these.

The two servers are this module's own (the shared ones run without a connector): about 30 s more
on 2 cores, started at once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.parity.compare import diff, make_reply, view
from tools.kv_echo import CONFIG
from tools.servers import ServerProcess, run_braid, run_vllm, tiny_model_dir

pytestmark = pytest.mark.vllm

ECHO = {"echo": {"remote_engine_id": "prefill-0", "remote_block_ids": [3, 4]}}
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "completions": ("/v1/completions", {"prompt": "x = 1", "max_tokens": 4, "temperature": 0}),
    "completions, two prompts and n=2": (
        "/v1/completions",
        {"prompt": ["x = 1", "import os\n"], "n": 2, "max_tokens": 3, "seed": 7},
    ),
    "completions, streamed": (
        "/v1/completions",
        {"prompt": "x = 1", "max_tokens": 4, "temperature": 0, "stream": True},
    ),
    "chat": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0},
    ),
    "chat, streamed": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0, "stream": True},
    ),
    "batch chat": (
        "/v1/chat/completions/batch",
        {
            "messages": [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "yo"}]],
            "max_tokens": 3,
            "temperature": 0,
        },
    ),
}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    tmp: Path = tmp_path_factory.mktemp("kv-echo")
    model = tiny_model_dir()
    config = json.dumps(CONFIG)
    with ExitStack() as stack, ThreadPoolExecutor(2) as pool:
        braid = pool.submit(
            stack.enter_context,
            run_braid("--engine-arg", f"kv_transfer_config={config}", model_dir=model, log=tmp / "braid.log"),
        )
        vllm = pool.submit(
            stack.enter_context, run_vllm("--kv-transfer-config", config, model_dir=model, log=tmp / "vllm.log")
        )
        yield braid.result(), vllm.result()


def _ask(server: ServerProcess, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(server.url + path, json={"model": server.model, **body}, timeout=60)
    return view(make_reply(r.status_code, r.headers.get("content-type", ""), r.content))


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kv", [ECHO, None], ids=["with echo", "without"])
def test_kv_transfer_params_come_back_as_from_vllm(
    case: str, kv: dict[str, Any] | None, pair: tuple[ServerProcess, ServerProcess]
) -> None:
    path, body = CASES[case]
    body = {**body, "kv_transfer_params": kv}
    braid, vllm = (_ask(server, path, body) for server in pair)
    assert not diff(vllm, braid), diff(vllm, braid)
    if kv is not None and case in ("completions", "chat", "completions, two prompts and n=2"):
        # what the connector gave back for the (first) prompt, so the case can fail
        assert braid["body"]["kv_transfer_params"]["echoed"] == ECHO["echo"], braid
