"""The default local model: a tiny Llama with a BPE tokenizer, trained briefly on Python sources.

No model hub is reachable on braid's machines, so ``braid serve`` with no ``--model`` builds
this model once and caches it. The build is deterministic (fixed corpus order, fixed seed, a
fixed number of training steps on one thread) and prints its progress.

* corpus: the ``.py`` files of this Python's standard library, in sorted order, up to ``corpus_bytes``;
* tokenizer: byte-level BPE (``tokenizers``), ``vocab_size`` ids, with ``<s>``, ``</s>``, ``<pad>``,
  and a chat template (:data:`CHAT_TEMPLATE`: role markers as text, ``</s>`` after each message);
* model: ``LlamaForCausalLM``, 2 layers, hidden 128, 4 heads / 2 KV heads, tied embeddings;
* training: ``steps`` of next-token prediction, so greedy output looks like Python, not noise.

Usage: ``python -m braid.models.tiny [--out DIR] [--steps N]``.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import attrs

BUILD_VERSION = 2
"""2: a chat template with role markers."""

# Role markers as plain text (no new tokens, so the vocabulary and the weights stay as they were),
# each message ended by </s> (EOS, a special token the template's text turns into its id, as
# chat templates of real models do). ``continue_final_message`` needs the final message's content
# to appear as it is: it does.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@attrs.frozen
class TinySpec:
    vocab_size: int = 2048
    hidden_size: int = 128
    intermediate_size: int = 384
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    max_positions: int = 1024
    corpus_bytes: int = 3_000_000
    steps: int = 600
    seq_len: int = 128
    batch: int = 16
    lr: float = 3e-3
    seed: int = 0

    def key(self) -> str:
        blob = json.dumps({"v": BUILD_VERSION, **attrs.asdict(self)}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]


def default_dir(spec: TinySpec = TinySpec()) -> Path:
    return Path.home() / ".cache" / "braid" / "models" / f"tiny-llama-{spec.key()}"


def _corpus(limit: int) -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    texts, total = [], 0
    for path in sorted(root.rglob("*.py")):
        if "test" in path.parts or "site-packages" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        texts.append(text)
        total += len(text)
        if total >= limit:
            break
    return texts


def _built(out: Path, spec: TinySpec) -> bool:
    marker = out / "braid-build.json"
    return marker.exists() and json.loads(marker.read_text()).get("key") == spec.key()


def build(out: Path, spec: TinySpec = TinySpec(), *, log=print) -> Path:  # type: ignore[no-untyped-def]
    """Build the model into ``out`` unless a build of the same spec is there; return ``out``
    (:func:`build_once`: safe from several processes at once)."""
    if build_once(out, lambda: _built(out, spec), lambda tmp: _build_into(tmp, spec, log)):
        log(f"[tiny] saved to {out}")
    return out


def build_once(out: Path, built: Callable[[], bool], build_into: Callable[[Path], None]) -> bool:
    """Build into ``out`` with ``build_into(tmp)`` unless ``built()``; True if this call built it.

    Safe to call from several processes at once: one builds while the others wait on a file
    lock, and the files are written to a temporary folder that is renamed into place, so no
    process ever loads a half-written build."""
    if built():
        return False
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if built():
            return False
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        try:
            build_into(tmp)
            if out.exists():
                shutil.rmtree(out)
            os.rename(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return True


def _build_into(out: Path, spec: TinySpec, log) -> None:  # type: ignore[no-untyped-def]
    marker = out / "braid-build.json"
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    started = time.monotonic()
    torch.manual_seed(spec.seed)
    torch.set_num_threads(1)  # the same float results on every machine size
    torch.use_deterministic_algorithms(True)
    texts = _corpus(spec.corpus_bytes)
    log(f"[tiny] corpus: {len(texts)} stdlib files, {sum(map(len, texts)) / 1e6:.1f} MB")

    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    tok.add_bos_token = True
    tok.chat_template = CHAT_TEMPLATE
    log(f"[tiny] tokenizer: {len(tok)} tokens ({time.monotonic() - started:.1f} s)")

    config = LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        head_dim=spec.hidden_size // spec.heads,
        max_position_embeddings=spec.max_positions,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    ids = torch.tensor([i for t in texts for i in tok.encode(t, add_special_tokens=False)], dtype=torch.long)
    span = spec.seq_len + 1
    windows = ids[: (len(ids) // span) * span].view(-1, span)
    log(
        f"[tiny] model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters; {len(ids)} training tokens"
    )
    optim = torch.optim.AdamW(model.parameters(), lr=spec.lr)
    gen = torch.Generator().manual_seed(spec.seed)
    model.train()
    for step in range(1, spec.steps + 1):
        batch = windows[torch.randint(len(windows), (spec.batch,), generator=gen)]
        loss = model(input_ids=batch[:, :-1], labels=batch[:, :-1].clone()).loss
        optim.zero_grad()
        loss.backward()
        optim.step()
        if step % 100 == 0 or step == spec.steps:
            log(f"[tiny] step {step}/{spec.steps} loss {loss.item():.3f} ({time.monotonic() - started:.0f} s)")
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    marker.write_text(json.dumps({"key": spec.key(), "spec": attrs.asdict(spec)}, indent=1))
    log(f"[tiny] built in {time.monotonic() - started:.0f} s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--steps", type=int, default=TinySpec().steps)
    args = p.parse_args(argv)
    spec = attrs.evolve(TinySpec(), steps=args.steps)
    print(build(args.out or default_dir(spec), spec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
