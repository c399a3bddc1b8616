"""What a request's ``model`` selects (braid.engine.base.select_model): the model, one of its
LoRA adapters, or vLLM's 404."""

from __future__ import annotations

import attrs
import pytest

from braid.engine.base import LoraAdapter, ModelInfo, select_model, served_names
from braid.errors import ModelNotFound

BASE = ModelInfo(name="base", root="/m", max_model_len=64, vocab_size=100)
A = LoraAdapter("a", 1, "/adapters/a", "base")
B = LoraAdapter("b", 2, "/adapters/b", "base")
WITH_ADAPTERS = attrs.evolve(BASE, adapters=(A, B))


@pytest.mark.parametrize("requested", [None, "", "base"])
def test_no_name_or_the_models_name_selects_the_model(requested: str | None) -> None:
    assert select_model(WITH_ADAPTERS, requested) is None


def test_an_adapters_name_selects_that_adapter() -> None:
    assert select_model(WITH_ADAPTERS, "a") is A
    assert select_model(WITH_ADAPTERS, "b") is B


@pytest.mark.parametrize(("info", "requested"), [(BASE, "a"), (WITH_ADAPTERS, "c"), (WITH_ADAPTERS, "A")])
def test_any_other_name_is_vllms_404(info: ModelInfo, requested: str) -> None:
    with pytest.raises(ModelNotFound) as exc:
        select_model(info, requested)
    assert exc.value.status == 404 and exc.value.param == "model"
    assert exc.value.message == f"The model `{requested}` does not exist."


def test_the_served_names_are_the_models_then_its_adapters() -> None:
    assert served_names(BASE) == ("base",)
    assert served_names(WITH_ADAPTERS) == ("base", "a", "b")


def test_an_adapter_id_starts_at_1_as_vllms_does() -> None:
    with pytest.raises(ValueError):
        LoraAdapter("a", 0, "/adapters/a", "base")
