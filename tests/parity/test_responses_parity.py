"""``/v1/responses`` against vLLM's own server: every case matches or is a documented deviation.

Run with the rest of the parity tier (the shared braid and vLLM servers, tools/servers.py);
the results join the tier's table (tests/parity/report.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.parity.compare import Reply
from tests.parity.deviations import DEVIATIONS
from tests.parity.matrix import MODEL, Case
from tests.parity.report import RESULTS, Result
from tests.parity.responses_cases import RESPONSES_CASES
from tests.parity.responses_compare import compare, parse_event_stream, stream_view
from tools.servers import ServerProcess

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=300) as c:
        yield c


def send(client: httpx.Client, base_url: str, case: Case) -> Reply:
    body = case.body if isinstance(case.body, bytes) else json.dumps(case.body).encode()
    with client.stream("POST", base_url + case.path, content=body, headers={"content-type": case.content_type}) as r:
        raw = r.read()
    content_type = r.headers.get("content-type", "")
    parsed = None
    if not content_type.startswith("text/event-stream"):
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = {"unparsed": raw[:200].decode(errors="replace")}
    return Reply(r.status_code, content_type, body=parsed, raw=raw)


@pytest.mark.parametrize("case", RESPONSES_CASES, ids=[c.name for c in RESPONSES_CASES])
def test_responses_case(case: Case, vllm_server: object, vllm_reference: ServerProcess, http: httpx.Client) -> None:
    braid = send(http, vllm_server.url, case)  # type: ignore[attr-defined]
    vllm = send(http, vllm_reference.url, case)
    if case.deviation is None:
        problems = compare(braid, vllm)
        outcome = "match" if not problems else "mismatch"
    else:
        problems = DEVIATIONS[case.deviation].check(braid, vllm, case.body)
        outcome = "deviation" if not problems else "mismatch"
    if braid.status == 200 and braid.content_type.startswith("text/event-stream"):
        # the framing, whatever vLLM does: numbered from 0, named as typed, no [DONE]
        framing = stream_view(braid.raw)
        if not (framing["sequence_numbers_count_up"] and framing["event_names_match"]) or framing["done_lines"]:
            problems = [*problems, f"braid's event framing is broken: {framing}"]
            outcome = "mismatch"
    detail = case.deviation or ""
    if problems:
        detail = "; ".join(problems[:3])
    RESULTS.append(Result(case.name, case.group, outcome, detail))
    assert not problems, "\n".join(problems[:20])


def test_cases_are_many_and_named_once() -> None:
    assert len(RESPONSES_CASES) >= 40
    assert len({c.name for c in RESPONSES_CASES}) == len(RESPONSES_CASES)


def _stored_flow(client: httpx.Client, url: str) -> dict[str, Reply]:
    """One conversation kept in a server's store, step by step: each step's answer."""

    def reply(r: httpx.Response) -> Reply:
        return Reply(r.status_code, r.headers.get("content-type", ""), body=r.json(), raw=r.content)

    def post(path: str, body: dict[str, object] | None = None) -> Reply:
        return reply(client.post(url + path, json=body))

    base = {"model": MODEL, "max_output_tokens": 6, "temperature": 0}
    out: dict[str, Reply] = {}
    out["stored response"] = first = post("/v1/responses", {**base, "input": "Hello there", "instructions": "Be brief"})
    out["retrieved"] = reply(client.get(f"{url}/v1/responses/{first.body['id']}"))
    out["previous_response_id"] = second = post(
        "/v1/responses", {**base, "input": "And then?", "previous_response_id": first.body["id"]}
    )
    out["previous_response_id twice, new instructions"] = post(
        "/v1/responses",
        {**base, "input": "More", "instructions": "New", "previous_response_id": second.body["id"]},
    )
    out["cancel a finished response"] = post(f"/v1/responses/{first.body['id']}/cancel")
    out["retrieve unknown"] = reply(client.get(f"{url}/v1/responses/resp_nope"))
    out["cancel unknown"] = post("/v1/responses/resp_nope/cancel")
    background = post("/v1/responses", {**base, "input": "Hello there", "background": True})
    deadline = time.monotonic() + 60
    while True:
        done = reply(client.get(f"{url}/v1/responses/{background.body['id']}"))
        if done.body.get("status") not in ("queued", "in_progress") or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    out["background, retrieved when done"] = done
    long = post(
        "/v1/responses",
        {**base, "input": "Hello there", "background": True, "max_output_tokens": 900, "ignore_eos": True},
    )
    time.sleep(0.3)
    out["background, cancelled"] = post(f"/v1/responses/{long.body['id']}/cancel")
    time.sleep(0.3)
    out["background, retrieved cancelled"] = reply(client.get(f"{url}/v1/responses/{long.body['id']}"))
    with client.stream(
        "POST", url + "/v1/responses", json={**base, "input": "Hi", "background": True, "stream": True}
    ) as r:
        raw = r.read()
    out["background streamed"] = Reply(r.status_code, r.headers.get("content-type", ""), raw=raw)
    unstored = post("/v1/responses", {**base, "input": "Hi", "store": False})
    out["store false, retrieved"] = reply(client.get(f"{url}/v1/responses/{unstored.body['id']}"))
    return out


def test_stored_responses(vllm_server: object, vllm_reference: ServerProcess, http: httpx.Client) -> None:
    """Stored responses step by step on both servers (vLLM's with VLLM_ENABLE_RESPONSES_API_STORE):
    each step's answers compared as the cases' are."""
    braid = _stored_flow(http, vllm_server.url)  # type: ignore[attr-defined]
    vllm = _stored_flow(http, vllm_reference.url)
    failures = []
    # Resuming a background stream once its run is over: vLLM replays the events it keeps (in
    # memory, for ever); braid keeps a run's events only while it runs (docs/compatibility.md).
    streamed = braid["background streamed"]
    response_id = parse_event_stream(streamed.raw)[0][1]["response"]["id"]
    vllm_id = parse_event_stream(vllm["background streamed"].raw)[0][1]["response"]["id"]
    late_braid = http.get(f"{vllm_server.url}/v1/responses/{response_id}", params={"stream": "true"})  # type: ignore[attr-defined]
    late_vllm = http.get(f"{vllm_reference.url}/v1/responses/{vllm_id}", params={"stream": "true"})
    late = (
        []
        if late_vllm.status_code == 200 and late_braid.status_code == 400
        else [f"resume after the run: braid {late_braid.status_code}, vLLM {late_vllm.status_code}"]
    )
    RESULTS.append(
        Result(
            "responses background stream resumed after its run",
            "responses stored",
            "deviation" if not late else "mismatch",
            "; ".join(late),
        )
    )
    failures += late
    for step, answer in braid.items():
        problems = compare(answer, vllm[step])
        RESULTS.append(
            Result(
                f"responses {step}",
                "responses stored",
                "match" if not problems else "mismatch",
                "; ".join(problems[:3]),
            )
        )
        failures += [f"{step}: {p}" for p in problems]
    assert not failures, "\n".join(failures[:20])
