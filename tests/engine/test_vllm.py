"""open_vllm_engine, without vLLM: what it refuses before anything starts."""

from __future__ import annotations

import pytest

from braid.engine import vllm


@pytest.mark.parametrize("client", ["trio", "asyncio"])
@pytest.mark.parametrize("refused", [{"max_num_queued_reqs": 5}, {"data_parallel_size": 2}], ids=repr)
async def test_both_clients_refuse_what_braid_would_not_honour(
    client: str, refused: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("an engine was started")

    monkeypatch.setattr(vllm, "open_core_engine", started)
    monkeypatch.setattr(vllm, "_open_asyncllm", started)
    monkeypatch.setattr(vllm, "prepare_environment", started)
    with pytest.raises(ValueError, match=next(iter(refused))):
        async with vllm.open_vllm_engine("model", engine_kwargs=refused, client=client):
            pass


@pytest.mark.parametrize("client", ["trio", "asyncio"])
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lora_modules": [("a", "/p/a")]}, "needs --enable-lora"),
        ({"lora_modules": [("a", "/p/a"), ("a", "/p/b")], "engine_kwargs": {"enable_lora": True}}, "not 'a'"),
        ({"lora_modules": [("m", "/p/a")], "served_model_name": "m", "engine_kwargs": {"enable_lora": True}}, "'m'"),
    ],
    ids=["without --enable-lora", "a name twice", "the model's name"],
)
async def test_lora_modules_no_request_could_use_are_refused_before_the_engine_starts(
    client: str, kwargs: dict, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("an engine was started")

    monkeypatch.setattr(vllm, "open_core_engine", started)
    monkeypatch.setattr(vllm, "_open_asyncllm", started)
    monkeypatch.setattr(vllm, "prepare_environment", started)
    with pytest.raises(ValueError, match=message):
        async with vllm.open_vllm_engine("model", client=client, **kwargs):
            pass
