"""Send one matrix case to one server and read the whole answer."""

from __future__ import annotations

import json

import httpx

from tests.parity.compare import Reply, make_reply
from tests.parity.matrix import Case


def send(client: httpx.Client, base_url: str, case: Case) -> Reply:
    headers = dict(case.headers)
    if case.method == "GET":
        with client.stream("GET", base_url + case.path, headers=headers) as resp:
            raw = resp.read()
    else:
        body = case.body if isinstance(case.body, bytes) else json.dumps(case.body).encode()
        headers["content-type"] = case.content_type
        with client.stream("POST", base_url + case.path, content=body, headers=headers) as resp:
            raw = resp.read()
    kept = tuple((name, resp.headers.get(name)) for name in case.response_headers)
    return make_reply(resp.status_code, resp.headers.get("content-type", ""), raw, kept)
