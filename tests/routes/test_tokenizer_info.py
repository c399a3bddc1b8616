"""braid.routes.tokenizer_info: vLLM's body from a Hugging Face tokenizer's init_kwargs."""

from __future__ import annotations

import json
from typing import Any

import attrs

from braid.routes.tokenizer_info import tokenizer_info_body


@attrs.frozen
class AddedToken:
    content: str


class LlamaTokenizerFast:
    def __init__(self, init_kwargs: dict[str, Any]) -> None:
        self.init_kwargs = init_kwargs


@attrs.frozen
class Holder:
    """What the body is built from: a braid tokenizer's ``parser_tokenizer()``."""

    hf: Any

    def parser_tokenizer(self) -> Any:
        return self.hf


def test_paths_are_dropped_added_tokens_are_their_text_and_the_class_is_named() -> None:
    hf = LlamaTokenizerFast(
        {
            "vocab_file": "/srv/model/vocab.json",
            "merges_file": "/srv/model/merges.txt",
            "bos_token": AddedToken("<s>"),
            "added_tokens_decoder": {0: {"content": "<s>"}, 1: AddedToken("</s>")},
            "extra": [AddedToken("<x>"), 3],
            "model_max_length": 1024,
            "odd": {1, 2},  # not JSON: its str, where vLLM's server fails
        }
    )
    body = json.loads(tokenizer_info_body(Holder(hf)))  # type: ignore[arg-type]
    assert body == {
        "bos_token": "<s>",
        "added_tokens_decoder": {"0": {"content": "<s>"}, "1": "</s>"},
        "extra": ["<x>", 3],
        "model_max_length": 1024,
        "odd": "{1, 2}",
        "tokenizer_class": "LlamaTokenizerFast",
    }
    assert "vocab_file" in hf.init_kwargs  # the tokenizer's own dict is left alone
