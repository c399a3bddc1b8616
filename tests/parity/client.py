"""Send one matrix case to one server and read the whole answer."""

from __future__ import annotations

import json

import httpx

from tests.parity.compare import Reply, make_reply
from tests.parity.matrix import Case


def send(client: httpx.Client, base_url: str, case: Case) -> Reply:
    if case.method == "GET":
        with client.stream("GET", base_url + case.path) as resp:
            raw = resp.read()
        return make_reply(resp.status_code, resp.headers.get("content-type", ""), raw)
    body = case.body if isinstance(case.body, bytes) else json.dumps(case.body).encode()
    with client.stream("POST", base_url + case.path, content=body, headers={"content-type": case.content_type}) as resp:
        raw = resp.read()
    return make_reply(resp.status_code, resp.headers.get("content-type", ""), raw)
