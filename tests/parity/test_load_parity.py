"""``GET /load`` against vLLM's own server: both run with ``--enable-server-load-tracking``, and
each counts a generation request from when it is taken until its answer has been sent.

The matrix compares the idle answer (``GET /load while idle``); this compares the figure while
one stream is open on each server, then after it has ended.
"""

from __future__ import annotations

import time

import httpx
import pytest

from tools.servers import ServerProcess

pytestmark = pytest.mark.vllm


def _load(url: str) -> object:
    r = httpx.get(url + "/load", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    return r.json()


def _settle(url: str, expected: object, within: float = 10.0) -> object:
    """The figure once it is ``expected`` (a server decrements after its last byte went out)."""
    deadline = time.monotonic() + within
    got = _load(url)
    while got != expected and time.monotonic() < deadline:
        time.sleep(0.05)
        got = _load(url)
    return got


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_stream_in_flight_counts_one_on_both(path: str, vllm_server: object, vllm_reference: ServerProcess) -> None:
    body: dict[str, object] = {"max_tokens": 400, "ignore_eos": True, "temperature": 0, "stream": True}
    body.update({"prompt": "x = 1"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "hi"}]})
    seen = {}
    for name, url in (("braid", vllm_server.url), ("vllm", vllm_reference.url)):  # type: ignore[attr-defined]
        assert _settle(url, {"server_load": 0}) == {"server_load": 0}
        with httpx.Client(timeout=60) as client, client.stream("POST", url + path, json=body) as r:
            chunks = r.iter_raw()
            next(chunks)  # the stream has started
            during = _load(url)
            rest = b"".join(chunks)
        assert rest.rstrip().endswith(b"data: [DONE]")
        seen[name] = (during, _settle(url, {"server_load": 0}))
    assert seen["braid"] == seen["vllm"] == ({"server_load": 1}, {"server_load": 0})
