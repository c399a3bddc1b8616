"""``GET /tokenizer_info`` (vLLM's ``--enable-tokenizer-info-endpoint``): the tokenizer's configuration.

The body is vLLM 0.32's: the Hugging Face tokenizer's ``init_kwargs`` (what
``tokenizer_config.json`` gave it) without ``vocab_file`` and ``merges_file`` (paths on the
server), every added token as its text, and ``tokenizer_class``: the class name of the tokenizer
vLLM's own server holds (vLLM's cached wrapper of Hugging Face's, the one braid's parsers read:
:meth:`braid.engine.base.Tokenizer.parser_tokenizer`). vLLM adds ``chat_template`` only when its
server is given one (``--chat-template``), which braid has no flag for, so it is never there. A
value JSON cannot hold is written as its ``str``, where vLLM's server would fail.

Without the option the route is not served (a 404, as on vLLM). The body is built once, on the
first request, since the tokenizer never changes.
"""

from __future__ import annotations

import json
from typing import Any

from braid.engine.base import Tokenizer
from braid.wire.openapi import Operation, Outcome

PATH = "/tokenizer_info"


def _plain(value: Any) -> Any:
    """A value of ``init_kwargs`` as vLLM serialises it: an added token (anything with
    ``content``) as its text, dicts and lists walked."""
    if hasattr(value, "content"):
        return value.content
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def tokenizer_info_body(tokenizer: Tokenizer) -> bytes:
    """The answer's JSON for ``tokenizer`` (see the module docstring)."""
    hf = tokenizer.parser_tokenizer()
    config = dict(getattr(hf, "init_kwargs", None) or {})
    config.pop("vocab_file", None)
    config.pop("merges_file", None)
    config = _plain(config)
    config["tokenizer_class"] = type(hf).__name__
    return json.dumps(config, ensure_ascii=False, default=str).encode()


OPERATION = Operation(
    "get",
    PATH,
    "The tokenizer's configuration (only with --enable-tokenizer-info-endpoint), as vLLM serves it",
    (
        Outcome(
            200,
            "tokenizer_config.json's fields as the tokenizer holds them, and tokenizer_class.",
            {"application/json": {"schema": {"type": "object", "required": ["tokenizer_class"]}}},
        ),
    ),
)


__all__ = ["OPERATION", "PATH", "tokenizer_info_body"]
