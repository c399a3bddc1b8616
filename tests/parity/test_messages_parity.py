"""``/v1/messages`` and its ``count_tokens`` against vLLM's own server (issue 31 §5): every case
must match or be a documented deviation, on the parity tier's two shared servers.

Compared after the normalisation of tests/parity/compare.py (ids, key order, float noise, error
messages), plus what Anthropic's shapes add: a thinking block's ``signature`` is random on both
servers (compared as 32 hex digits); an error is compared on its status, its shape (Anthropic's
or vLLM's OpenAI one) and its type. A stream is compared as what a client rebuilds from it: the
``message_start`` message, the content blocks (their text, thinking and call inputs joined
across deltas, since the two servers cut deltas differently), the ``message_delta``, the kinds
of events in order with runs of deltas folded into one, and whether the framing holds
(tests/anthropic_sse.py: blocks opened in order, one at a time, each closed; ``message_stop``
last, once).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.anthropic_sse import check_framing, parse_anthropic_sse, rebuild
from tests.parity.compare import HEX32, Reply, diff
from tests.parity.deviations import DEVIATIONS
from tests.parity.matrix import Case
from tests.parity.messages_matrix import MESSAGES_MATRIX, SHOWS, SHOWS_EITHER
from tests.parity.report import RESULTS, Result
from tools.servers import ServerProcess

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=300) as c:
        yield c


def send(client: httpx.Client, base_url: str, case: Case) -> Reply:
    body = case.body if isinstance(case.body, bytes) else json.dumps(case.body).encode()
    headers = {"content-type": case.content_type}
    with client.stream("POST", base_url + case.path, content=body, headers=headers) as resp:
        raw = resp.read()
    content_type = resp.headers.get("content-type", "")
    if resp.status_code == 200 and content_type.startswith("text/event-stream"):
        return Reply(resp.status_code, content_type, events=tuple(parse_anthropic_sse(raw)), raw=raw)
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = {"unparsed": raw[:200].decode(errors="replace")}
    return Reply(resp.status_code, content_type, body=parsed, raw=raw)


def _normal(value: Any) -> Any:
    """Ids dropped and signatures as their shape, at any depth."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k == "id":
                continue
            if k == "signature" and isinstance(v, str):
                out[k] = "<32 hex digits>" if HEX32.fullmatch(v) else v
            else:
                out[k] = _normal(v)
        return out
    if isinstance(value, list):
        return [_normal(v) for v in value]
    return value


def error_view(body: Any) -> dict[str, Any]:
    if isinstance(body, dict) and body.get("type") == "error":
        return {"shape": "anthropic", "type": body["error"].get("type")}
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return {"shape": "openai", "type": error.get("type"), "code": error.get("code")}
    return {"shape": "other", "body": body}


def _kinds(events: list[tuple[str, dict[str, Any]]]) -> list[str]:
    kinds: list[str] = []
    for kind, data in events:
        name = kind if kind != "content_block_delta" else f"delta:{data['delta']['type']}"
        if not kinds or kinds[-1] != name or not name.startswith("delta:"):
            kinds.append(name)
    return kinds


def view(reply: Reply) -> dict[str, Any]:
    if reply.status != 200:
        return {"status": reply.status, "error": error_view(reply.body)}
    if reply.events is None:
        return {"status": 200, "body": _normal(reply.body)}
    events = list(reply.events)
    try:
        check_framing(events)
        framing = "ok"
    except AssertionError as exc:
        framing = f"broken: {exc}"
    by_kind = {kind: data for kind, data in events}
    return {
        "status": 200,
        "framing": framing,
        "kinds": _kinds(events),
        "start": _normal(by_kind.get("message_start")),
        "blocks": _normal(rebuild(events)) if framing == "ok" else None,
        "delta": by_kind.get("message_delta"),
        "errors": [error_view(d) for k, d in events if k == "error"],
    }


@pytest.mark.parametrize("case", MESSAGES_MATRIX, ids=[c.name for c in MESSAGES_MATRIX])
def test_case(case: Case, vllm_server: object, vllm_reference: ServerProcess, http: httpx.Client) -> None:
    braid = send(http, vllm_server.url, case)  # type: ignore[attr-defined]
    vllm = send(http, vllm_reference.url, case)
    if case.deviation is None:
        problems = diff(view(braid), view(vllm))
        outcome = "match" if not problems else "mismatch"
    else:
        problems = DEVIATIONS[case.deviation].check(braid, vllm, case.body)
        outcome = "deviation" if not problems else "mismatch"
    detail = case.deviation or ""
    if problems:
        detail = "; ".join(problems[:3])
    RESULTS.append(Result(case.name, case.group, outcome, detail))
    assert not problems, "\n".join(problems[:20])
    shown = json.dumps(view(vllm))
    assert all(s in shown for s in SHOWS.get(case.name, ())), f"the case shows too little: {shown}"
    either = SHOWS_EITHER.get(case.name)
    assert either is None or any(all(s in shown for s in one) for one in either), f"the case shows too little: {shown}"


def test_the_messages_matrix_is_large_and_names_are_unique() -> None:
    assert len(MESSAGES_MATRIX) >= 20
    assert len({c.name for c in MESSAGES_MATRIX}) == len(MESSAGES_MATRIX)
    assert set(SHOWS) | set(SHOWS_EITHER) <= {c.name for c in MESSAGES_MATRIX}
