"""LoRA adapters on the real engine: braid's own test adapter (braid.models.lora) served on the
tiny model by a second braid (``--enable-lora --lora-modules``), apart from the tier's shared
server. The shared engine stays without LoRA: with LoRA on, vLLM 0.32's CPU build kills the
engine on any step that computes prompt logprobs for two requests at once (its Punica CPU
wrapper maps the adapters per request, the prompt logprobs' logits per token: vllm#16668), and
the parity and vLLM tiers ask for prompt logprobs in batches."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from braid.engine.vllm_common import CPU_ENVIRONMENT, OFFLINE_ENVIRONMENT
from tests.conftest import LORA_ADAPTER as ADAPTER
from tests.helpers import parse_sse
from tools.servers import SERVED_NAME, ServerProcess, engine_settings, tiny_model_dir

pytestmark = pytest.mark.vllm

PROMPT = "def main("


@pytest.fixture
def adapter(lora_adapter: Path) -> Path:
    return lora_adapter


def _complete(server: ServerProcess, model: str, **extra: Any) -> dict[str, Any]:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 16, "temperature": 0, **extra}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_models_lists_the_adapter_after_the_model_with_the_model_as_parent(
    lora_server: ServerProcess, adapter: Path
) -> None:
    cards = httpx.get(lora_server.url + "/v1/models").json()["data"]
    assert [c["id"] for c in cards] == [SERVED_NAME, ADAPTER]
    base, card = cards
    assert base["parent"] is None and base["max_model_len"] == 1024
    assert card["parent"] == SERVED_NAME and card["root"] == str(adapter)
    assert card["max_model_len"] is None and card["object"] == "model"


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions", "/tokenize"])
def test_an_unknown_model_is_vllms_404(lora_server: ServerProcess, route: str) -> None:
    body: dict[str, Any] = {"model": "tiny-lora-2", "max_tokens": 4}
    body |= {"messages": [{"role": "user", "content": "hi"}]} if "chat" in route else {"prompt": PROMPT}
    r = httpx.post(lora_server.url + route, json=body, timeout=60)
    assert r.status_code == 404, r.text
    error = r.json()["error"]
    assert error["type"] == "NotFoundError" and error["param"] == "model"
    assert "`tiny-lora-2` does not exist" in error["message"]


def test_tokenize_takes_the_adapters_name_and_the_models_tokenizer(lora_server: ServerProcess) -> None:
    def tokens(model: str) -> list[int]:
        r = httpx.post(lora_server.url + "/tokenize", json={"model": model, "prompt": PROMPT}, timeout=60)
        assert r.status_code == 200, r.text
        return list(r.json()["tokens"])

    assert tokens(ADAPTER) == tokens(SERVED_NAME)


def test_the_adapter_changes_greedy_output_and_names_itself(lora_server: ServerProcess) -> None:
    base = _complete(lora_server, SERVED_NAME)
    tuned = _complete(lora_server, ADAPTER)
    assert base["model"] == SERVED_NAME and tuned["model"] == ADAPTER
    assert tuned["choices"][0]["text"] != base["choices"][0]["text"]


def test_a_streamed_chat_with_the_adapter_names_it_throughout(lora_server: ServerProcess) -> None:
    body = {
        "model": ADAPTER,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 12,
        "temperature": 0,
        "ignore_eos": True,
    }
    url = lora_server.url + "/v1/chat/completions"
    whole = httpx.post(url, json=body, timeout=60).json()
    streamed = httpx.post(url, json={**body, "stream": True, "stream_options": {"include_usage": True}}, timeout=60)
    events = [e for e in parse_sse(streamed.content) if e != "[DONE]"]
    assert {e["model"] for e in events} == {ADAPTER} and whole["model"] == ADAPTER
    # (the stream is a request of its own: its text need not be the whole answer's)
    assert events[-1]["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"] == 12
    assert [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1] == "length"


def _first_top(server: ServerProcess, model: str) -> dict[str, float]:
    """The first generated token's five most likely tokens and their logprobs, for ``model``."""
    body = _complete(server, model, max_tokens=1, logprobs=5)
    return dict(body["choices"][0]["logprobs"]["top_logprobs"][0])


def _close(a: dict[str, float], b: dict[str, float], tol: float) -> bool:
    """Most of the same likely tokens, each as likely to ``tol`` (the last of five may change
    places with the sixth when the two are near)."""
    common = a.keys() & b.keys()
    return len(common) >= 4 and all(abs(a[t] - b[t]) <= tol for t in common)


def test_base_and_adapter_requests_in_one_batch_each_get_their_own_weights(lora_server: ServerProcess) -> None:
    # Compared on the first token's distribution, not greedy text: a request alone and the same in
    # a batch of eight need not pick the same tokens (docs/architecture.md), but each distribution
    # is its own model's to float precision, and the two models' are far apart.
    alone = {m: _first_top(lora_server, m) for m in (SERVED_NAME, ADAPTER)}
    assert not _close(alone[SERVED_NAME], alone[ADAPTER], 0.05)
    models = [SERVED_NAME, ADAPTER] * 4
    with ThreadPoolExecutor(len(models)) as pool:
        together = list(pool.map(lambda m: _first_top(lora_server, m), models))
    for m, top in zip(models, together, strict=True):
        assert _close(top, alone[m], 1e-2), (m, top, alone[m])


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_prompt_logprobs_are_refused_with_lora_on_the_cpu_build_and_the_engine_lives(
    lora_server: ServerProcess, route: str
) -> None:
    """Without braid's refusal, one completions request with two prompts (two engine requests
    in a step), or two chat requests at once, stop vLLM's engine core: a 503 for them and every
    later request (issue 29's spike). So any request for them is refused, before it starts."""
    body: dict[str, Any] = {"max_tokens": 4, "prompt_logprobs": 1}
    body |= {"messages": [{"role": "user", "content": "hi"}]} if "chat" in route else {"prompt": [PROMPT, "x = 1"]}
    r = httpx.post(lora_server.url + route, json=body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "prompt_logprobs" and "vllm#16668" in error["message"]
    assert httpx.get(lora_server.url + "/health").status_code == 200
    assert _complete(lora_server, SERVED_NAME, logprobs=1)["choices"][0]["logprobs"] is not None


@pytest.fixture
def vllm_environment() -> Iterator[None]:
    """open_vllm_engine sets vLLM's environment in this process's os.environ: put it back after."""
    saved = {key: os.environ.get(key) for key in {**OFFLINE_ENVIRONMENT, **CPU_ENVIRONMENT}}
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.mark.usefixtures("vllm_environment")
@pytest.mark.parametrize("client", ["trio", "asyncio"])
async def test_the_engine_generates_with_the_adapter_only_when_a_request_names_it(adapter: Path, client: str) -> None:
    """braid's engine path on its own (EngineRequest.lora -> vLLM's LoRARequest), in process:
    the adapter's greedy output differs from the model's, and the requests around it that name
    no adapter get the model's own."""
    from braid.engine.base import EngineRequest, SamplingParams
    from braid.engine.vllm import open_vllm_engine

    kwargs = {**engine_settings(0), "enable_lora": True, "max_lora_rank": 8}
    params = SamplingParams(max_tokens=16, temperature=0.0, logprobs=5)
    async with open_vllm_engine(
        str(tiny_model_dir()),
        served_model_name=SERVED_NAME,
        engine_kwargs=kwargs,
        lora_modules=[(ADAPTER, str(adapter))],
        client=client,
    ) as engine:
        (selected,) = engine.info.adapters
        assert (selected.name, selected.id, selected.path, selected.parent) == (ADAPTER, 1, str(adapter), SERVED_NAME)
        ids = tuple(engine.tokenizer.encode(PROMPT))
        texts, firsts = {}, {}
        for name, choice in (("base", None), ("tuned", selected), ("base again", None)):
            async with engine.open_request(EngineRequest(name, ids, params, PROMPT, lora=choice)) as outputs:
                got = [o async for o in outputs]
            texts[name] = "".join(c.text for out in got for c in out.choices)
            (first, *_) = [lp for out in got for c in out.choices for lp in (c.logprobs or ())]
            firsts[name] = first
    assert texts["tuned"] != texts["base"]
    # the request after the adapter's has the model's own distribution (to float precision: two
    # requests need not pick the same tokens, docs/architecture.md)
    again, base = firsts["base again"], firsts["base"]
    common = again.keys() & base.keys()
    assert len(common) >= 4 and all(abs(again[t].logprob - base[t].logprob) <= 1e-2 for t in common), (again, base)


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


@pytest.mark.usefixtures("vllm_environment")
async def test_an_adapter_vllm_cannot_load_fails_the_start(tmp_path: Path) -> None:
    """As vLLM's server loads its --lora-modules: at start, not at the first request naming one."""
    from braid.engine.vllm import open_vllm_engine

    missing = tmp_path / "no-adapter"
    kwargs = {**engine_settings(0), "enable_lora": True, "max_lora_rank": 8}
    # the ValueError, inside the engine's nursery's exception group (an AssertionError if it started)
    with pytest.raises(BaseException) as caught:
        async with open_vllm_engine(str(tiny_model_dir()), engine_kwargs=kwargs, lora_modules=[("gone", str(missing))]):
            raise AssertionError("the engine started")
    (error,) = _leaves(caught.value)
    assert isinstance(error, ValueError), repr(error)
    assert str(error).startswith(f"--lora-modules gone={missing}: ") and "No adapter found" in str(error)


def _lora_info(url: str) -> list[dict[str, str]]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=10).text
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == "vllm:lora_requests_info"]
    return [dict(s.labels) for s in family.samples]


def test_metrics_report_the_adapters_requests_under_vllms_labels(lora_server: ServerProcess) -> None:
    """vLLM's vllm:lora_requests_info, fed by braid's engine client as AsyncLLM feeds it: one
    sample per (max_lora, waiting, running) label set seen, set to the time it was last seen."""
    _complete(lora_server, ADAPTER, max_tokens=32, ignore_eos=True)
    labels = _lora_info(lora_server.url)
    assert all(set(s) == {"max_lora", "waiting_lora_adapters", "running_lora_adapters"} for s in labels), labels
    # vLLM names an adapter in both labels while it has a request either way (its LoRARequestStates)
    assert {"max_lora": "2", "waiting_lora_adapters": ADAPTER, "running_lora_adapters": ADAPTER} in labels, labels


def test_an_adapter_over_the_rank_limit_is_a_400_with_vllms_reason(lora_server: ServerProcess, tmp_path: Path) -> None:
    """vLLM's server answers a 500 here (docs/compatibility.md); the adapter is not served."""
    from braid.models import lora

    big = lora.build(tmp_path / "rank16", tiny_model_dir(), lora.LoraSpec(rank=16), log=lambda *_: None)
    r = httpx.post(lora_server.url + "/v1/load_lora_adapter", json={"lora_name": "big", "lora_path": str(big)})
    assert r.status_code == 400, r.text
    assert "LoRA rank 16 is greater than max_lora_rank 8" in r.json()["error"]["message"]
    assert "big" not in [c["id"] for c in httpx.get(lora_server.url + "/v1/models").json()["data"]]
    assert _complete(lora_server, ADAPTER)["model"] == ADAPTER


def test_an_unload_under_a_running_stream_leaves_it_whole_on_the_engine(
    lora_server: ServerProcess, adapter: Path
) -> None:
    """vLLM's unload stops serving the name; the engine keeps the weights, so the stream that
    began with them ends as it would have, and no engine request is left behind."""
    url = lora_server.url
    load = {"lora_name": "tiny-lora-run", "lora_path": str(adapter)}
    assert httpx.post(url + "/v1/load_lora_adapter", json=load, timeout=60).status_code == 200
    body = {
        "model": "tiny-lora-run",
        "prompt": PROMPT,
        "max_tokens": 200,
        "ignore_eos": True,
        "temperature": 0,
        "logprobs": 0,
    }
    with (
        httpx.Client(timeout=120) as client,
        client.stream("POST", url + "/v1/completions", json={**body, "stream": True}) as r,
    ):
        chunks = r.iter_raw()
        raw = next(chunks)
        unload = client.post(url + "/v1/unload_lora_adapter", json={"lora_name": "tiny-lora-run"})
        assert unload.status_code == 200, unload.text
        assert client.post(url + "/v1/completions", json=body).status_code == 404
        assert lora_server.unfinished() >= 1  # the stream was still running in the engine
        raw += b"".join(chunks)
    events = parse_sse(raw)
    assert events[-1] == "[DONE]" and not any("error" in e for e in events[:-1])
    choices = [e["choices"][0] for e in events[:-1] if e["choices"]]
    assert sum(len(c["logprobs"]["tokens"]) for c in choices) == 200 and choices[-1]["finish_reason"] == "length"
    lora_server.wait_idle()
