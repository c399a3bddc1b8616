"""``kv_transfer_params`` on chat: the prompt token ids a prefill stage forwards, as vLLM 0.32 reads them.

In disaggregated serving a router sends a request to a prefill server, then to a decode server
with the prefill's ``kv_transfer_params``; vLLM's chat route takes that object's
``prompt_token_ids``, when present, as the prompt itself, so the decode stage neither renders
the messages again nor tokenizes them (vLLM's ``_reused_prompt_token_ids``). The rules, vLLM's:

* The ids are taken out of the object in every case: what reaches the engine
  (``SamplingParams.extra_args``) never holds them.
* The batch route refuses them (400, ``param`` ``kv_transfer_params.prompt_token_ids``): one
  prompt cannot serve several conversations.
* With ``echo`` they are dropped and the messages rendered (echo needs the messages).
* Otherwise they must be a non-empty list of non-negative integers, each in the vocabulary
  (400 naming ``kv_transfer_params.prompt_token_ids``), and they are the prompt.

Completions take the object as it is (vLLM reads no prompt from it there).
"""

from __future__ import annotations

from typing import Any

from braid.errors import InvalidRequest

PARAM = "kv_transfer_params.prompt_token_ids"


def reused_prompt(
    kv: dict[str, Any] | None, *, batch: bool, echo: bool, vocab_size: int
) -> tuple[dict[str, Any] | None, tuple[int, ...] | None]:
    """``kv`` without its ``prompt_token_ids``, and those ids when they are the prompt (None:
    render the messages). Raises :class:`~braid.errors.InvalidRequest` as the module says."""
    if kv is None or kv.get("prompt_token_ids") is None:
        return kv, None
    if batch:
        raise InvalidRequest(
            "Batch chat completions do not support `kv_transfer_params['prompt_token_ids']`: one "
            "pre-tokenized prompt cannot serve several conversations.",
            param=PARAM,
        )
    rest = {k: v for k, v in kv.items() if k != "prompt_token_ids"}
    if echo:
        return rest, None
    ids = kv["prompt_token_ids"]
    # bool is an int to Python: vLLM checks the exact type, and so does this.
    if not isinstance(ids, list) or not ids or any(type(x) is not int or x < 0 for x in ids):
        raise InvalidRequest(
            "`kv_transfer_params['prompt_token_ids']` must be a non-empty list of non-negative integers.",
            param=PARAM,
        )
    top = max(ids)
    if top >= vocab_size:
        raise InvalidRequest(f"Token id {top} is out of vocabulary", param=PARAM)
    return rest, tuple(ids)


__all__ = ["PARAM", "reused_prompt"]
