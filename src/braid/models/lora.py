"""A test LoRA adapter for the default tiny model (:mod:`braid.models.tiny`), built here.

No model hub is reachable on braid's machines, so the adapter that the LoRA tests serve is made
locally, once, and cached next to the model, like the model itself. It is written directly in
PEFT's format (``adapter_config.json`` and ``adapter_model.safetensors``, the files vLLM's
``--lora-modules`` and ``LoRARequest`` load), without ``peft``:

* targets: every linear layer of every decoder layer (``q_proj``, ``k_proj``, ``v_proj``,
  ``o_proj``, ``gate_proj``, ``up_proj``, ``down_proj``), at rank ``rank`` (within vLLM's
  default ``--max-lora-rank`` of 16);
* weights: ``lora_A`` ~ N(0, 1/in_features), ``lora_B`` ~ N(0, b_scale²/rank), from a seeded
  generator, so the adapter is the same on every machine, and far enough from the base model
  that greedy output visibly changes (an untrained adapter: it makes the model worse, which is
  all a test needs to tell the two apart);
* shapes: read from the base model's ``config.json``; the cache key covers the spec and that
  config, so a new base model gets a new adapter.

Usage: ``python -m braid.models.lora [--out DIR] [--base DIR]`` (default base: the tiny model,
built first if need be).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import attrs

from braid.models.tiny import build_once

BUILD_VERSION = 1

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
MARKER = "braid-build.json"


@attrs.frozen
class LoraSpec:
    rank: int = 8
    alpha: int = 16
    targets: tuple[str, ...] = ATTENTION + MLP
    b_scale: float = 0.5
    seed: int = 0

    def key(self, base: Path) -> str:
        """The cache key of this adapter on the model in ``base`` (its ``config.json``)."""
        config = json.loads((base / "config.json").read_text())
        blob = json.dumps({"v": BUILD_VERSION, **attrs.asdict(self), "base": config}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]


def default_dir(base: Path, spec: LoraSpec = LoraSpec()) -> Path:
    """Where the adapter of ``spec`` on the model in ``base`` is cached: next to the model."""
    return base.parent / f"{base.name}-lora-{spec.key(base)}"


def default_adapter() -> Path:
    """The default adapter on braid's default tiny model (both built once, then cached)."""
    from braid.models import tiny

    base = tiny.build(tiny.default_dir())
    return build(default_dir(base), base)


def _shapes(config: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each target layer of a Llama-shaped model."""
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    kv = config.get("num_key_value_heads") or heads
    inter = config["intermediate_size"]
    return {
        "q_proj": (hidden, heads * head_dim),
        "k_proj": (hidden, kv * head_dim),
        "v_proj": (hidden, kv * head_dim),
        "o_proj": (heads * head_dim, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }


def _built(out: Path, key: str) -> bool:
    marker = out / MARKER
    return marker.exists() and json.loads(marker.read_text()).get("key") == key


def build(out: Path, base: Path, spec: LoraSpec = LoraSpec(), *, log=print) -> Path:  # type: ignore[no-untyped-def]
    """Build the adapter into ``out`` unless a build of the same spec and base is there; return ``out``.

    As :func:`braid.models.tiny.build`: several processes may call it at once (one builds under
    a file lock, the others wait), and the files are written to a temporary folder renamed into
    place, so no process ever loads a half-written adapter."""
    key = spec.key(base)
    if not build_once(out, lambda: _built(out, key), lambda tmp: _build_into(tmp, base, spec, key)):
        return out
    log(f"[lora] saved to {out}")
    return out


def _build_into(out: Path, base: Path, spec: LoraSpec, key: str) -> None:
    import torch
    from safetensors.torch import save_file

    config = json.loads((base / "config.json").read_text())
    shapes = _shapes(config)
    unknown = sorted(set(spec.targets) - set(shapes))
    if unknown:
        raise ValueError(f"unknown target modules {unknown}; known: {sorted(shapes)}")
    gen = torch.Generator().manual_seed(spec.seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for name in spec.targets:
            fan_in, fan_out = shapes[name]
            part = "self_attn" if name in ATTENTION else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{part}.{name}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(spec.rank, fan_in, generator=gen) / fan_in**0.5
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(fan_out, spec.rank, generator=gen) * (
                spec.b_scale / spec.rank**0.5
            )
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(base),
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "lora_dropout": 0.0,
        "target_modules": list(spec.targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }
    (out / "adapter_config.json").write_text(json.dumps(adapter_config, indent=1))
    (out / MARKER).write_text(json.dumps({"key": key, "spec": attrs.asdict(spec)}, indent=1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--base", type=Path, default=None, help="the base model's folder (default: the tiny model)")
    args = p.parse_args(argv)
    if args.base is None:
        from braid.models import tiny

        args.base = tiny.build(tiny.default_dir())
    print(build(args.out or default_dir(args.base), args.base))
    return 0


if __name__ == "__main__":
    sys.exit(main())
