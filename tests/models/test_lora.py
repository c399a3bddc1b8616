"""The test LoRA adapter (braid.models.lora): its files are what vLLM loads (PEFT's format, shapes
from the base model's config), the build is deterministic and cached. That the adapter changes
what the model generates is checked on the real engine (tests/vllm/test_lora.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors import safe_open

from braid.models import lora

BASE_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "vocab_size": 64,
}


@pytest.fixture
def base(tmp_path: Path) -> Path:
    path = tmp_path / "base"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(BASE_CONFIG))
    return path


def _tensors(adapter: Path) -> dict[str, tuple[int, ...]]:
    with safe_open(str(adapter / "adapter_model.safetensors"), "pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


def test_the_adapter_is_a_peft_lora_on_every_linear_layer_with_the_base_models_shapes(base: Path) -> None:
    out = lora.build(base.parent / "adapter", base, log=lambda _: None)
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 8 and config["lora_alpha"] == 16
    assert set(config["target_modules"]) == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    }
    assert config["base_model_name_or_path"] == str(base)
    shapes = _tensors(out)
    assert len(shapes) == 3 * 7 * 2
    r = 8
    # (in, out): q 32->4*8, k and v 32->2*8, o 32->32, gate and up 32->48, down 48->32
    expected = {"q_proj": (32, 32), "k_proj": (32, 16), "v_proj": (32, 16), "o_proj": (32, 32)}
    expected |= {"gate_proj": (32, 48), "up_proj": (32, 48), "down_proj": (48, 32)}
    for layer in range(3):
        for name, (fan_in, fan_out) in expected.items():
            part = "self_attn" if name.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{part}.{name}"
            assert shapes[f"{prefix}.lora_A.weight"] == (r, fan_in)
            assert shapes[f"{prefix}.lora_B.weight"] == (fan_out, r)


def test_the_build_is_deterministic_and_cached(base: Path) -> None:
    logged: list[str] = []
    one = lora.build(base.parent / "one", base, log=logged.append)
    two = lora.build(base.parent / "two", base, log=logged.append)
    assert len(logged) == 2
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        assert (one / name).read_bytes() == (two / name).read_bytes()
    weights = one / "adapter_model.safetensors"
    mtime = weights.stat().st_mtime_ns
    assert lora.build(one, base, log=logged.append) == one
    assert len(logged) == 2 and weights.stat().st_mtime_ns == mtime  # not built again


def test_the_cache_key_follows_the_spec_and_the_base_model(base: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({**BASE_CONFIG, "num_hidden_layers": 2}))
    keys = {
        lora.LoraSpec().key(base),
        lora.LoraSpec(seed=1).key(base),
        lora.LoraSpec(rank=16).key(base),
        lora.LoraSpec().key(other),
    }
    assert len(keys) == 4
    assert lora.default_dir(base) == base.parent / f"base-lora-{lora.LoraSpec().key(base)}"
    # a stale build (another spec) in the folder is replaced
    out = lora.build(tmp_path / "adapter", base, lora.LoraSpec(rank=4), log=lambda _: None)
    lora.build(out, base, log=lambda _: None)
    assert json.loads((out / "adapter_config.json").read_text())["r"] == 8
    assert all(shape[0] == 8 for key, shape in _tensors(out).items() if "lora_A" in key)


def test_the_weights_differ_from_a_zero_adapter(base: Path) -> None:
    """Each layer's update B @ A is far from zero (PEFT's own init has B = 0: no change at all)."""
    from safetensors.torch import load_file

    tensors = load_file(
        str(lora.build(base.parent / "adapter", base, log=lambda _: None) / "adapter_model.safetensors")
    )
    for key, a in tensors.items():
        if "lora_A" in key:
            delta = tensors[key.replace("lora_A", "lora_B")] @ a
            assert delta.abs().mean().item() > 0.02, key


def test_an_unknown_target_module_is_refused(base: Path) -> None:
    with pytest.raises(ValueError, match="lm_head"):
        lora.build(base.parent / "adapter", base, lora.LoraSpec(targets=("q_proj", "lm_head")), log=lambda _: None)
    assert not (base.parent / "adapter").exists()


def test_the_command_builds_into_the_folder_given(base: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = base.parent / "cli"
    assert lora.main(["--out", str(out), "--base", str(base)]) == 0
    assert (out / "adapter_model.safetensors").exists()
    assert capsys.readouterr().out.strip().endswith(str(out))
