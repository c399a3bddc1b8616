"""HfTokenizer's worker side (braid.engine.vllm_common): which copy encode_many uses, over fake tokenizers."""

from __future__ import annotations

import types

from braid.engine.vllm_common import HfTokenizer


class FakeBackend:
    """A Rust backend as HfTokenizer sees it; ``shift`` makes a copy encode differently."""

    def __init__(self, shift: int = 0, copies_shift: int = 0, copyable: bool = True) -> None:
        self.shift, self.copies_shift, self.copyable = shift, copies_shift, copyable
        self.batches = 0

    def to_str(self) -> str:
        if not self.copyable:
            raise RuntimeError("cannot serialize")
        return str(self.copies_shift)

    @classmethod
    def from_str(cls, text: str) -> FakeBackend:
        return cls(shift=int(text))

    def encode(self, text: str, add_special_tokens: bool = True) -> types.SimpleNamespace:
        return types.SimpleNamespace(ids=ids(text, add_special_tokens, self.shift))

    def encode_batch(self, texts: list[str], add_special_tokens: bool = True) -> list[types.SimpleNamespace]:
        self.batches += 1
        return [self.encode(t, add_special_tokens) for t in texts]


def ids(text: str, special: bool, shift: int = 0) -> list[int]:
    return ([1] if special else []) + [ord(c) + shift for c in text]


class FakeHf:
    def __init__(self, backend: FakeBackend | None) -> None:
        self._tokenizer = backend
        self.encodes = 0

    def get_vocab(self) -> dict[str, int]:
        return {"a": 0, "<pad>": 1}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.encodes += 1
        return ids(text, add_special_tokens)


TEXTS = ["ab", "", "é東"]


def test_a_copy_that_encodes_alike_is_used_for_batches() -> None:
    tok = HfTokenizer(FakeHf(FakeBackend()), 100)
    assert tok.max_chars_per_token == 5  # "<pad>", as vLLM counts it
    assert tok._worker_backend is not None
    assert tok.encode_many(TEXTS, add_special_tokens=False) == [ids(t, False) for t in TEXTS]
    assert tok._worker_backend.batches == 1


def test_a_copy_that_encodes_differently_is_not_used() -> None:
    hf = FakeHf(FakeBackend(copies_shift=1))
    tok = HfTokenizer(hf, 100)
    assert tok._worker_backend is None and tok._worker_tok is not hf  # a deep copy of its own
    assert tok.encode_many(TEXTS) == [ids(t, True) for t in TEXTS]


def test_a_backend_that_cannot_be_copied_falls_back_to_a_copy_of_the_tokenizer() -> None:
    hf = FakeHf(FakeBackend(copyable=False))
    tok = HfTokenizer(hf, 100)
    assert tok._worker_backend is None and tok._worker_tok is not hf
    assert tok.encode_many(TEXTS) == [ids(t, True) for t in TEXTS]


def test_a_slow_tokenizer_loops_encode_on_its_copy() -> None:
    hf = FakeHf(None)
    tok = HfTokenizer(hf, 100)
    assert tok.encode_many(TEXTS) == [ids(t, True) for t in TEXTS]
    assert hf.encodes == 0  # the Trio thread's instance was not used


def test_encode_calls_the_backend_directly_when_it_encodes_alike() -> None:
    hf = FakeHf(FakeBackend())
    tok = HfTokenizer(hf, 100)
    before = hf.encodes  # the probes
    assert tok.encode("é東", add_special_tokens=False) == ids("é東", False)
    assert tok.encode("ab") == ids("ab", True)
    assert hf.encodes == before  # not through the wrapper


def test_encode_keeps_the_wrapper_when_the_backend_encodes_differently() -> None:
    hf = FakeHf(FakeBackend(shift=1))  # the wrapper adds a step of its own; its copies do not
    tok = HfTokenizer(hf, 100)
    before = hf.encodes
    assert tok.encode("ab") == ids("ab", True)
    assert hf.encodes == before + 1
