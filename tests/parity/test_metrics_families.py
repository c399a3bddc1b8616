"""braid's vllm:* families against vLLM's own server's: the same names, types and label names."""

from __future__ import annotations

import httpx
import pytest

from tests.helpers import VllmServer
from tests.vllm.test_vllm_metrics import REQUIRED, families
from tools.servers import ServerProcess

pytestmark = pytest.mark.vllm

SERVING_LAYER = {"vllm:tool_call_parser_invocations"}
"""vLLM's families that its OpenAI serving layer counts, not its engine's stat logger: not on
braid's /metrics yet (issue 27 §1 is the engine's statistics)."""


def test_braid_exposes_vllms_families_as_vllm_does(vllm_server: VllmServer, vllm_reference: ServerProcess) -> None:
    for server in (vllm_server.url, vllm_reference.url):
        body = {"model": vllm_server.model, "prompt": "Hello there", "max_tokens": 3}
        assert httpx.post(server + "/v1/completions", json=body, timeout=60).status_code == 200
    ours = families(vllm_server.url)
    # braid turns prometheus_client's *_created series off (braid.metrics); the text parser reads
    # vLLM's as gauge families of their own.
    theirs = {name: spec for name, spec in families(vllm_reference.url).items() if not name.endswith("_created")}
    assert {name: theirs.get(name) for name in REQUIRED} == REQUIRED
    differ = {name: (spec, ours.get(name)) for name, spec in theirs.items() if ours.get(name) != spec}
    assert set(differ) == SERVING_LAYER, sorted(differ.items())
    assert set(ours) == set(theirs) - SERVING_LAYER, sorted(set(ours) ^ set(theirs))
