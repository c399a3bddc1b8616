"""bench.gpu without vLLM: the weightless model directory it builds and the engine arguments."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.gpu import build_model_dir, engine_args, parameters
from tools.servers import _braid_engine_argv, server_env, tiny_model_dir


def _config(d: Path) -> dict[str, Any]:
    return json.loads((d / "config.json").read_text())


def _tokenizer(d: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(d))


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gpu-model")
    return {c: build_model_dir(root / c, c) for c in ("8b", "small")}


def test_the_8b_dir_has_llama_3_8b_shape_and_braids_tokenizer(dirs: dict[str, Path]) -> None:
    d = dirs["8b"]
    cfg = _config(d)
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["model_type"] == "llama"
    assert (
        cfg["hidden_size"],
        cfg["intermediate_size"],
        cfg["num_hidden_layers"],
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
        cfg["head_dim"],
    ) == (4096, 14336, 32, 32, 8, 128)
    assert cfg["rope_theta"] == cfg["rope_parameters"]["rope_theta"] == 500000.0
    assert cfg["max_position_embeddings"] == 8192
    assert not cfg["tie_word_embeddings"]
    tok = _tokenizer(d)
    assert cfg["vocab_size"] == len(tok) == len(_tokenizer(tiny_model_dir()))
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (
        tok.bos_token_id,
        tok.eos_token_id,
        tok.pad_token_id,
    )
    assert (d / "tokenizer.json").read_bytes() == (tiny_model_dir() / "tokenizer.json").read_bytes()
    # no weights: the servers load it with load_format=dummy
    assert not [f for f in d.iterdir() if f.suffix in (".safetensors", ".bin", ".pt", ".pth")]
    assert 6.9e9 < parameters(cfg) < 7.1e9  # 8B less the 128k vocabulary's embeddings


def test_transformers_reads_the_8b_config_as_written(dirs: dict[str, Path]) -> None:
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(str(dirs["8b"]))
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_key_value_heads) == (4096, 32, 8)
    rope = getattr(cfg, "rope_parameters", None) or {"rope_theta": cfg.rope_theta}
    assert rope["rope_theta"] == 500000.0


def test_the_small_config_is_small(dirs: dict[str, Path]) -> None:
    small, big = _config(dirs["small"]), _config(dirs["8b"])
    assert small["num_hidden_layers"] <= 2 and small["hidden_size"] <= 256
    assert small["hidden_size"] == small["num_attention_heads"] * small["head_dim"]
    assert small["num_attention_heads"] % small["num_key_value_heads"] == 0
    assert parameters(small) < 5e6
    assert small["vocab_size"] == big["vocab_size"] == len(_tokenizer(dirs["small"]))


def test_the_vocabulary_and_special_ids_follow_the_tokenizer(tmp_path: Path) -> None:
    """Another tokenizer (specials in another order, added tokens): not braid's 2048 and 0/1/2."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<pad>", "</s>", "<s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(["def f(x):\n    return x + 1\n"] * 20, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    tok.add_tokens(["<extra_a>", "<extra_b>"])
    src = tmp_path / "tok"
    tok.save_pretrained(str(src))
    n = len(_tokenizer(src))

    cfg = _config(build_model_dir(tmp_path / "model", "small", tokenizer_dir=src))
    assert cfg["vocab_size"] == n != 2048
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (2, 1, 0)


def test_gpu_engine_args_are_dummy_256_and_not_the_cpu_ones() -> None:
    gpu, cpu = engine_args("cuda"), engine_args("cpu")
    for args in (gpu, cpu):
        assert args["load_format"] == "dummy"
        assert args["max_num_seqs"] == 256
        assert args["max_num_batched_tokens"] >= args["max_num_seqs"]
    assert "enforce_eager" not in gpu and "distributed_executor_backend" not in gpu
    assert gpu["dtype"] == "bfloat16" and 2 * gpu["gpu_memory_utilization"] < 0.9
    assert cpu["dtype"] == "float32" and cpu["enforce_eager"] is True
    assert not any(k.startswith(("VLLM_", "TORCH_")) for k in server_env(cpu=False))
    assert server_env(cpu=True)["VLLM_TARGET_DEVICE"] == "cpu"


def test_braid_gets_every_engine_arg() -> None:
    argv = _braid_engine_argv({**engine_args("cuda"), "seed": 3})
    assert argv[argv.index("--max-num-seqs") + 1] == "256"
    assert argv[argv.index("--dtype") + 1] == "bfloat16"
    engine = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in argv[1::2] if "=" in a}
    assert engine == {"max_num_batched_tokens": "8192", "load_format": "dummy", "gpu_memory_utilization": "0.42"}
    assert "--seed" not in argv  # run_braid passes its own
