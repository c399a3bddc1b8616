"""The serving benchmark on a GPU: braid beside vLLM's own server on an 8B-shaped model, one command.

Run: ``python -m bench.gpu [--quick] [--config 8b|small] [--device auto|cpu|cuda] [--out FILE]``
(``make bench-gpu``; on a GPU machine ``make bench-gpu EXTRAS=test,gpu``). Budget: under 8 minutes
on one H100 or H200 (80 GB or more). Not yet run on a GPU; the estimate is two engine starts of
1–1.5 minutes each (import, dummy load, torch.compile, CUDA graphs) and about 1.5 minutes of load
(``--quick``: under a minute). Here (2 CPU cores, ``--config small --quick``): about 80 s.

* Model: no weights to download. :func:`build_model_dir` writes a directory with braid's own
  tokenizer (the files of the tiny model, ``tools.servers.tiny_model_dir()``) and a
  ``config.json`` of a ``LlamaForCausalLM`` shaped like Llama-3-8B (hidden 4096, intermediate
  14336, 32 layers, 32 heads, 8 KV heads, rope theta 500000, 8192 positions) whose
  ``vocab_size`` and BOS/EOS/PAD ids are the tokenizer's. Both servers load it with
  ``load_format=dummy`` (random weights), so the engine does an 8B model's work per token, and
  the text is noise, which a throughput benchmark does not read. ``--config small`` (2 layers,
  hidden 256, 4 heads, 2 KV heads, intermediate 512, same tokenizer) runs on a CPU machine.
* Servers: ``braid serve --engine vllm`` and ``python -m vllm.entrypoints.openai.api_server``,
  both up at once on the same engine arguments (:func:`engine_args`: ``max_num_seqs`` 256,
  ``load_format=dummy``; on a GPU bf16, ``max_model_len`` 2048, ``max_num_batched_tokens``
  8192 and ``gpu_memory_utilization`` 0.42 each, so both fit on one GPU; on a CPU braid's CPU
  settings). On a GPU they start one after the other (two engines sizing their KV cache at once
  would each count the other's memory) and get none of the CPU-only environment
  (``tools.servers.server_env``).
* Load and rounds: the serving section's (``bench.serving``): ``vllm bench serve`` in one worker
  process, 32 random input tokens and 64 output tokens, ignore_eos, temperature 1.0, all
  requests released at once and capped at concurrency 1, 64 and 256, rounds alternating which
  server goes first (``bench.serving.alternating_runs``).
* Reported per server and concurrency (median over rounds, min–max): output tok/s, TTFT p50,
  ITL p50, CPU time of the front-end process and of its EngineCore process per output token;
  then braid/vLLM ratios. Printed as Markdown and written to ``--out`` (default
  ``docs/bench/gpu-DATE.md``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import statistics
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import attrs

from bench.common import ROOT, table
from bench.run import _commit, _machine, _versions
from bench.serving import INPUT_LEN, OUTPUT_LEN, SEED, _spread, alternating_runs, serve_argv
from bench.vllm_tools import WORK, Worker, engine_core_pid, start_pair

CONCURRENCIES = (1, 64, 256)
MAX_NUM_SEQS = 256
GPU_MEMORY_UTILIZATION = 0.42  # each of two engines on one GPU


@attrs.frozen
class Shape:
    """The shape of a ``LlamaForCausalLM`` (its vocabulary is the tokenizer's)."""

    hidden_size: int
    intermediate_size: int
    layers: int
    heads: int
    kv_heads: int
    max_positions: int = 8192
    rope_theta: float = 500000.0


SHAPES = {
    # Llama-3-8B / Llama-3.1-8B (without 3.1's long-context rope scaling)
    "8b": Shape(hidden_size=4096, intermediate_size=14336, layers=32, heads=32, kv_heads=8),
    "small": Shape(hidden_size=256, intermediate_size=512, layers=2, heads=4, kv_heads=2, max_positions=2048),
}
_NOT_COPIED = ("config.json", "braid-build.json")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def build_model_dir(out: Path, config: str, tokenizer_dir: Path | None = None) -> Path:
    """Write a weightless model directory into ``out`` (replaced if there): the tokenizer files
    of ``tokenizer_dir`` (default: braid's tiny model) and a ``config.json`` of shape
    ``SHAPES[config]`` whose vocabulary size and special token ids are the tokenizer's."""
    from transformers import AutoTokenizer

    if tokenizer_dir is None:
        from tools.servers import tiny_model_dir

        tokenizer_dir = tiny_model_dir()
    shape = SHAPES[config]
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for f in sorted(tokenizer_dir.iterdir()):
        if f.is_file() and f.name not in _NOT_COPIED and not f.name.endswith(_WEIGHT_SUFFIXES):
            shutil.copy2(f, out / f.name)
    tok = AutoTokenizer.from_pretrained(str(out))
    head_dim = shape.hidden_size // shape.heads
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": len(tok),
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": shape.max_positions,
        "rms_norm_eps": 1e-5,
        # rope_theta for transformers 4, rope_parameters for transformers 5
        "rope_theta": shape.rope_theta,
        "rope_parameters": {"rope_theta": shape.rope_theta, "rope_type": "default"},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": "bfloat16",
        "braid_dummy": f"bench.gpu --config {config}: no weights; load with load_format=dummy",
    }
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out


def parameters(cfg: dict[str, Any]) -> int:
    """Parameter count of a ``LlamaForCausalLM`` config without tied embeddings."""
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    q = cfg["num_attention_heads"] * cfg["head_dim"]
    layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h
    return cfg["num_hidden_layers"] * layer + 2 * v * h + h


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M"


def engine_args(device: str, gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION) -> dict[str, Any]:
    """The engine arguments both servers get (``tools.servers`` adds the seed)."""
    from tools.servers import engine_settings

    if device == "cpu":
        base = {k: v for k, v in engine_settings().items() if k != "seed"}
    else:
        base = {
            "dtype": "bfloat16",
            "max_model_len": 2048,
            "max_num_batched_tokens": 8192,
            "gpu_memory_utilization": gpu_memory_utilization,
        }
    return {**base, "max_num_seqs": MAX_NUM_SEQS, "load_format": "dummy"}


def _plan(quick: bool) -> tuple[int, dict[int, int]]:
    """(rounds, prompts per concurrency)."""
    if quick:
        return 2, {1: 8, 64: 128, 256: 256}
    return 3, {1: 24, 64: 256, 256: 1024}


def _device(choice: str) -> str:
    if choice != "auto":
        return choice
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _gpu_name() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown GPU"
    return out.splitlines()[0] if out else "unknown GPU"


def _log(msg: str, started: float) -> None:
    print(f"[gpu {time.monotonic() - started:5.0f} s] {msg}", flush=True)


def run(config: str, device: str, quick: bool, gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION) -> str:
    """Run the benchmark; return its report (Markdown)."""
    started = time.monotonic()
    rounds, prompts = _plan(quick)
    cpu = device == "cpu"
    settings = engine_args(device, gpu_memory_utilization)
    model_dir = build_model_dir(WORK / f"dummy-{config}", config)
    cfg = json.loads((model_dir / "config.json").read_text())
    _log(f"model {model_dir} ({config}, {_count(parameters(cfg))} parameters, vocab {cfg['vocab_size']})", started)
    with ExitStack() as stack:
        bench_worker = stack.enter_context(Worker("bench", WORK / "gpu-bench.log", cpu=cpu))
        _log("starting braid and vLLM's server", started)
        braid, vllm = stack.enter_context(
            start_pair("gpu", model_dir=model_dir, settings=settings, cpu=cpu, one_at_a_time=not cpu)
        )
        servers = {"braid": braid, "vllm": vllm}
        engine_pids = {kind: engine_core_pid(s) for kind, s in servers.items()}
        setup_s = time.monotonic() - started
        _log("servers up", started)

        argv = serve_argv(servers, model_dir, "gpu")

        for kind in ("braid", "vllm"):  # warm-up, not recorded
            bench_worker.call(op="serve", argv=argv(kind, 64, 64, f"warmup-{kind}"))
        _log("warm-up done", started)
        runs = alternating_runs(
            bench_worker,
            servers,
            engine_pids,
            argv,
            CONCURRENCIES,
            prompts,
            rounds,
            lambda r: _log(f"round {r + 1}/{rounds} done", started),
        )
    total_s = time.monotonic() - started

    def per_token(kind: str, c: int, i: int) -> list[float]:
        """µs of CPU per output token of process i (1: front end, 2: EngineCore), per round."""
        return [r["cpu"][i] * 1e6 / r["total_output_tokens"] for r in runs[kind][c]]

    def med(kind: str, c: int, key: str) -> float:
        return statistics.median(r[key] for r in runs[kind][c])

    rows = []
    for c in CONCURRENCIES:
        for kind, name in (("braid", "braid"), ("vllm", "vLLM server")):
            rows.append(
                [
                    name,
                    c,
                    _spread([r["output_throughput"] for r in runs[kind][c]]),
                    _spread([r["p50_ttft_ms"] for r in runs[kind][c]]),
                    _spread([r["p50_itl_ms"] for r in runs[kind][c]]),
                    _spread(per_token(kind, c, 1)),
                    _spread(per_token(kind, c, 2)),
                ]
            )
    ratio_rows = []
    for c in CONCURRENCIES:
        fe = statistics.median(per_token("braid", c, 1)) / statistics.median(per_token("vllm", c, 1))
        ratio_rows.append(
            [
                c,
                f"{med('braid', c, 'output_throughput') / med('vllm', c, 'output_throughput'):.2f}",
                f"{med('braid', c, 'p50_ttft_ms') / med('vllm', c, 'p50_ttft_ms'):.2f}",
                f"{med('braid', c, 'p50_itl_ms') / med('vllm', c, 'p50_itl_ms'):.2f}",
                f"{fe:.2f}",
            ]
        )
    shape = SHAPES[config]
    where = f"{_gpu_name()} (cuda)" if device == "cuda" else "CPU (no GPU)"
    md = [
        f"# braid vs vLLM's server on {where}, {config} dummy model",
        "",
        "Written by `python -m bench.gpu` (bench/gpu.py); do not edit by hand.",
        "",
        f"- date: {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}; commit {_commit()}"
        + ("; **quick mode**" if quick else ""),
        f"- device: {where}; machine: {_machine()}",
        f"- versions: {_versions()}",
        f"- model: `LlamaForCausalLM`, `load_format=dummy` (random weights), {shape.layers} layers, hidden "
        f"{shape.hidden_size}, intermediate {shape.intermediate_size}, {shape.heads} heads / {shape.kv_heads} KV "
        f"heads, rope theta {shape.rope_theta:g}; vocab {cfg['vocab_size']} (braid's tiny tokenizer); "
        f"{_count(parameters(cfg))} parameters",
        f"- engine arguments, both servers: `{json.dumps(settings)}`, seed {SEED}"
        + (" (braid adds its CPU defaults, as `tools.servers` gives vLLM's server)" if cpu else "")
        + f"; braid's admission reserve raises its engine's running cap to {MAX_NUM_SEQS + MAX_NUM_SEQS // 16}",
        f"- load: `vllm bench serve` random dataset, {INPUT_LEN} input / {OUTPUT_LEN} output tokens, ignore_eos, "
        f"temperature 1.0, request rate inf, max concurrency C; prompts per run: "
        + ", ".join(f"{prompts[c]} at {c}" for c in CONCURRENCIES)
        + f"; {rounds} rounds alternating which server goes first",
        f"- time: setup (model dir, server starts) {setup_s:.0f} s; total {total_s:.0f} s",
        "",
        "Median over rounds (min–max). CPU µs/out tok: CPU time of the server's front-end process "
        "(braid; vLLM's API server) and of its EngineCore process over a run, per output token.",
        "",
        table(
            [
                "server",
                "concurrency",
                "out tok/s",
                "TTFT p50 ms",
                "ITL p50 ms",
                "front-end CPU µs/out tok",
                "EngineCore CPU µs/out tok",
            ],
            rows,
        ),
        "",
        "braid / vLLM server, ratios of the medians (throughput: higher is better; the rest: lower):",
        "",
        table(
            ["concurrency", "out tok/s", "TTFT p50", "ITL p50", "front-end CPU/out tok"],
            ratio_rows,
        ),
        "",
    ]
    return "\n".join(md)


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--config", choices=sorted(SHAPES), default=None, help="default: 8b on a GPU, small on a CPU")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: cuda if torch sees one")
    p.add_argument("--quick", action="store_true", help="fewer prompts and rounds")
    p.add_argument("--out", type=Path, default=None, help="default: docs/bench/gpu-DATE.md")
    p.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=GPU_MEMORY_UTILIZATION,
        help="of each of the two engines (both share the GPU)",
    )
    args = p.parse_args()
    device = _device(args.device)
    config = args.config or ("8b" if device == "cuda" else "small")
    if device == "cpu" and config == "8b":
        print("[gpu] warning: the 8b config on a CPU is very slow; --config small is the one for CPUs", flush=True)
    report = run(config, device, args.quick, args.gpu_memory_utilization)
    out = args.out or ROOT / "docs" / "bench" / f"gpu-{datetime.date.today().isoformat()}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report)
    print(report)
    print(f"[gpu] wrote {out}", flush=True)


if __name__ == "__main__":
    main()
