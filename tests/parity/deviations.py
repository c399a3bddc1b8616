"""braid's deliberate deviations from vLLM's server, each a check of both sides' answers.

A deviation is asserted, not tolerated: its check says exactly what each server must do, so the
case fails if braid starts to match vLLM silently, if vLLM changes, or if the two differ in any
other way. Every key here is named in docs/compatibility.md (a test checks that).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from tests.parity.compare import Reply, view

View = dict[str, Any]


@attrs.frozen
class Deviation:
    key: str
    summary: str
    check: Callable[[Reply, Reply], list[str]]  # (braid, vllm) -> problems; [] = exactly as documented


def _views(check: Callable[[View, View], list[str]]) -> Callable[[Reply, Reply], list[str]]:
    return lambda braid, vllm: check(view(braid), view(vllm))


def _strict_types(braid: View, vllm: View) -> list[str]:
    problems = []
    if vllm["status"] != 200:
        problems.append(f"vLLM no longer coerces the value: status {vllm['status']}")
    if braid["status"] != 400 or braid.get("error", {}).get("type") != "Bad Request":
        problems.append(f"braid should refuse it with a 400 schema error, got {braid}")
    return problems


def _eager_validation(braid: View, vllm: View) -> list[str]:
    """vLLM streams a 200 whose only content is one error event and [DONE]; braid answers the
    same error (type, param, code) as a 400 before any stream starts."""
    problems = []
    stream = vllm.get("stream")
    if vllm["status"] != 200 or stream is None:
        return [f"vLLM no longer answers this with an in-stream error: {vllm}"]
    if stream["choices"] or stream["usage_chunks"] or stream["done"] != 1 or len(stream["errors"]) != 1:
        problems.append(f"vLLM's stream is not just one error event and [DONE]: {stream}")
    if braid["status"] != 400:
        problems.append(f"braid should refuse with a 400, got {braid['status']}")
    elif stream["errors"] and braid["error"] != stream["errors"][0]:
        problems.append(f"the errors differ: braid {braid['error']} vs vLLM {stream['errors'][0]}")
    return problems


def _unsupported_fields(braid: View, vllm: View) -> list[str]:
    """vLLM honours the field; braid refuses it with a 400 naming it, never ignoring it."""
    problems = []
    if vllm["status"] != 200:
        problems.append(f"vLLM no longer honours the field: {vllm}")
    if braid["status"] != 400 or braid.get("error", {}).get("type") != "BadRequestError" or not braid["error"]["param"]:
        problems.append(f"braid should refuse with a 400 naming the field, got {braid}")
    return problems


DEVIATIONS: dict[str, Deviation] = {
    d.key: d
    for d in (
        Deviation(
            "strict_types",
            'JSON values of the wrong type (a float token id 2.0, max_tokens "5", n 1.0) are refused, not coerced',
            _views(_strict_types),
        ),
        Deviation(
            "eager_validation",
            "errors vLLM's engine finds after a stream started are a 400 before it starts",
            _views(_eager_validation),
        ),
        Deviation(
            "unsupported_fields",
            "an output-changing field braid does not implement is refused, not ignored",
            _views(_unsupported_fields),
        ),
    )
}
