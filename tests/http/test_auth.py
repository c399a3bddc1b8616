"""API keys and CORS on a live server (braid.http.auth, braid.http.cors). Raw sockets where httpx
would normalise the request target."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest
import trio

from braid.http import app
from tests.helpers import LiveServer, start_server

KEYS = ("key-one", "key-two")
BODY = json.dumps({"prompt": "Hi", "max_tokens": 2}).encode()
_CHAT = [{"role": "user", "content": "Hi"}]
BODIES = {
    "/v1/completions": BODY,
    "/v1/chat/completions": json.dumps({"messages": _CHAT, "max_tokens": 2}).encode(),
    "/v1/chat/completions/batch": json.dumps({"messages": [_CHAT, _CHAT], "max_tokens": 2}).encode(),
    "/tokenize": json.dumps({"messages": _CHAT}).encode(),
    "/detokenize": json.dumps({"tokens": [75, 108]}).encode(),
    "/invocations": json.dumps({"messages": _CHAT, "max_tokens": 2}).encode(),
    "/v1/messages": json.dumps({"model": "scripted", "messages": _CHAT, "max_tokens": 2}).encode(),
    "/v1/messages/count_tokens": json.dumps({"model": "scripted", "messages": _CHAT}).encode(),
    "/v1/responses": json.dumps({"input": "Hi", "max_output_tokens": 2}).encode(),
}


async def raw(server: LiveServer, head: str, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    """Send ``head`` (request line and headers, no blank line) as it is; the status, the headers
    (lower-cased names, last value wins) and the body of the answer."""
    host, port = server.url.removeprefix("http://").split(":")
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        length = f"Content-Length: {len(body)}\r\n" if body else ""
        await stream.send_all(f"{head}\r\nConnection: close\r\n{length}\r\n".encode() + body)
        received = b""
        with trio.fail_after(10):
            while chunk := await stream.receive_some():
                received += chunk
    header_block, _, rest = received.partition(b"\r\n\r\n")
    lines = header_block.decode("latin-1").split("\r\n")
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, rest


def assert_unauthorized(status: int, headers: dict[str, str], body: bytes, *, anthropic: bool = False) -> None:
    """A 401 in vLLM's error shape, or (``anthropic``: on ``/v1/messages``) in Anthropic's."""
    assert status == 401, (status, body)
    assert headers["www-authenticate"] == "Bearer"
    assert headers["connection"] == "close"  # the body was not read: no keep-alive after it
    if anthropic:
        payload = json.loads(body)
        assert payload["type"] == "error" and payload["error"]["type"] == "Unauthorized", payload
        assert set(payload["error"]) == {"type", "message"} and payload["error"]["message"]
        return
    error = json.loads(body)["error"]
    assert (error["type"], error["code"], error["param"]) == ("Unauthorized", 401, None)
    assert error["message"]


@pytest.fixture
async def guarded(nursery: trio.Nursery) -> AsyncIterator[LiveServer]:
    srv = await start_server(nursery, api_keys=KEYS)
    yield srv
    srv.shutdown.set()


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


ROUTES = [
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/chat/completions/batch"),
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
    ("POST", "/invocations"),  # open in vLLM (it guards /v1 paths only); guarded like every route here
    ("GET", "/v1/models"),
    ("GET", "/version"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
    ("GET", "/load"),  # open in vLLM; guarded like every route here (docs/deploy.md)
    ("GET", "/get_load"),
    ("POST", "/v1/messages"),
    ("POST", "/v1/messages/count_tokens"),
    ("POST", "/v1/responses"),
]


def test_the_guarded_routes_are_every_route_but_health() -> None:
    assert {path for _, path in ROUTES} == app.ROUTES - {"/health"}


@pytest.mark.parametrize(("method", "path"), ROUTES)
async def test_every_route_needs_a_right_key(guarded: LiveServer, method: str, path: str) -> None:
    async with httpx.AsyncClient(base_url=guarded.url, timeout=10) as c:
        for headers in (
            {},
            bearer("wrong"),
            bearer("key-one-"),
            {"Authorization": "key-one"},
            {"Authorization": "Bearer"},
            {"Authorization": "Basic a2V5LW9uZQ=="},
            {"Authorization": "Token key-one"},
            {"x-api-key": "wrong"},
            {"x-api-key": "Bearer key-one"},
            # Authorization, when there is one, is the credential: a right x-api-key beside it is not read
            {**bearer("wrong"), "x-api-key": "key-one"},
        ):
            r = await c.request(method, path, headers=headers, content=BODIES[path] if method == "POST" else None)
            anthropic = path.startswith("/v1/messages")
            assert_unauthorized(
                r.status_code, {k.lower(): v for k, v in r.headers.items()}, r.content, anthropic=anthropic
            )
        # a braid extension: the key as Anthropic's clients send it, on every route
        r = await c.request(
            method,
            path,
            headers={"x-api-key": KEYS[1], "Content-Type": "application/json"},
            content=BODIES[path] if method == "POST" else None,
        )
        assert r.status_code == 200, r.text
        for key in KEYS:
            r = await c.request(
                method,
                path,
                headers={**bearer(key), "Content-Type": "application/json"},
                content=BODIES[path] if method == "POST" else None,
            )
            assert r.status_code == 200, r.text
        # the scheme is case-insensitive (RFC 9110), the key is not
        r = await c.request(
            method,
            path,
            headers={"Authorization": "bearer key-two", "Content-Type": "application/json"},
            content=BODIES[path] if method == "POST" else None,
        )
        assert r.status_code == 200
        r = await c.request(method, path, headers=bearer("KEY-TWO"), content=BODIES[path] if method == "POST" else None)
        assert r.status_code == 401


async def test_health_is_open_and_only_its_exact_path(guarded: LiveServer) -> None:
    assert (await raw(guarded, "GET /health HTTP/1.1\r\nHost: h"))[0] == 200
    assert (await raw(guarded, "HEAD /health HTTP/1.1\r\nHost: h"))[0] == 200
    assert_unauthorized(*await raw(guarded, "POST /health HTTP/1.1\r\nHost: h", b"{}"))
    for target in ("/health/", "//health", "/%68ealth", "/HEALTH", "/health/../health", "/health?x=1#"):
        status, headers, body = await raw(guarded, f"GET {target} HTTP/1.1\r\nHost: h")
        if target.startswith("/health?"):
            assert status == 200  # the query is not part of the path
        else:
            assert_unauthorized(status, headers, body)


@pytest.mark.parametrize(
    "target",
    [
        "/v1/completions",
        "//v1/completions",
        "/v1/completions/",
        "/v1/%63ompletions",
        "/V1/COMPLETIONS",
        "/v1/../v1/completions",
        "/v1/./completions",
        "/health/../v1/completions",
        "/health%2f..%2fv1/completions",
        "/health%2F..%2Fv1%2Fcompletions",
        "/health/%2e%2e/v1/completions",
        "http://h/health",
        "http://h/v1/completions",
        "/nope",
    ],
)
async def test_path_variants_without_a_key_are_401(guarded: LiveServer, target: str) -> None:
    head = f"POST {target} HTTP/1.1\r\nHost: h\r\nContent-Type: application/json"
    assert_unauthorized(*await raw(guarded, head, BODY))


@pytest.mark.parametrize("host", ["h/health", "h/health?", "x:1/health#", "localhost"])
async def test_a_host_header_cannot_open_a_route(guarded: LiveServer, host: str) -> None:
    for head in (f"GET /v1/models HTTP/1.1\r\nHost: {host}", f"GET http://{host}/v1/models HTTP/1.1\r\nHost: {host}"):
        assert_unauthorized(*await raw(guarded, head))


@pytest.mark.parametrize("path", ["/v1/models", "/health"])
async def test_a_websocket_without_a_key_is_refused_before_it_opens(guarded: LiveServer, path: str) -> None:
    host, port = guarded.url.removeprefix("http://").split(":")
    async with await trio.open_tcp_stream(host, int(port)) as stream:
        await stream.send_all(
            f"GET {path} HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        with trio.fail_after(10):
            answer = await stream.receive_some()
    # closed before accept: hypercorn answers 403, never 101 Switching Protocols
    assert answer.startswith(b"HTTP/1.1 403"), answer[:80]


async def test_unknown_routes_are_401_before_404(guarded: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=guarded.url, timeout=10) as c:
        for method, path in [
            ("GET", "/nope"),
            ("GET", "/v1/chat/completions"),
            ("DELETE", "/v1/models"),
            ("OPTIONS", "/v1/completions"),
        ]:
            r = await c.request(method, path)
            assert r.status_code == 401, (method, path, r.status_code)
        assert (await c.get("/nope", headers=bearer("key-one"))).status_code == 404


async def test_metrics_public_opens_only_metrics(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery, api_keys=KEYS, metrics_public=True)
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as c:
        r = await c.get("/metrics")
        assert r.status_code == 200 and "braid_engine_requests_total" in r.text
        assert (await c.get("/v1/models")).status_code == 401
        assert (await c.get("/metrics/")).status_code == 401
    srv.shutdown.set()


async def test_without_keys_everything_is_open_as_before(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery)
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as c:
        for path in ("/v1/models", "/version", "/metrics", "/health", "/openapi.json"):
            assert (await c.get(path)).status_code == 200
        assert (await c.get("/nope")).status_code == 404
    srv.shutdown.set()


# --- CORS -----------------------------------------------------------------------------------------

PREFLIGHT = {
    "Origin": "https://app.example",
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type",
}


def cors_headers(r: httpx.Response) -> dict[str, str]:
    return {k.lower(): v for k, v in r.headers.items() if k.lower().startswith("access-control-")}


async def test_cors_is_off_by_default(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery)
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as c:
        assert cors_headers(await c.options("/v1/completions", headers=PREFLIGHT)) == {}
        r = await c.get("/v1/models", headers={"Origin": "https://app.example"})
        assert cors_headers(r) == {} and "vary" not in r.headers
    srv.shutdown.set()


async def test_cors_allowed_origin_preflight_without_key_then_keyed_request(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery, api_keys=KEYS, allowed_origins=("https://app.example",))
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as c:
        r = await c.options("/v1/completions", headers=PREFLIGHT)
        assert r.status_code == 204
        got = cors_headers(r)
        assert got["access-control-allow-origin"] == "https://app.example"
        assert "POST" in got["access-control-allow-methods"]
        assert "authorization" in got["access-control-allow-headers"].lower()
        assert r.headers["vary"] == "Origin"
        origin = {"Origin": "https://app.example"}
        r = await c.get("/v1/models", headers=origin)
        assert r.status_code == 401  # the preflight opened nothing
        assert cors_headers(r) == {"access-control-allow-origin": "https://app.example"}
        r = await c.get("/v1/models", headers={**origin, **bearer("key-one")})
        assert r.status_code == 200
        assert cors_headers(r) == {"access-control-allow-origin": "https://app.example"}
        # another origin gets no CORS header, and its preflight is an ordinary (refused) request
        other = {**PREFLIGHT, "Origin": "https://evil.example"}
        r = await c.options("/v1/completions", headers=other)
        assert r.status_code == 401 and cors_headers(r) == {}
        r = await c.get("/v1/models", headers={"Origin": "https://evil.example", **bearer("key-one")})
        assert r.status_code == 200 and cors_headers(r) == {}
        assert cors_headers(await c.get("/v1/models", headers=bearer("key-one"))) == {}
    srv.shutdown.set()


async def test_cors_any_origin(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery, allowed_origins=("*",))
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as c:
        r = await c.options("/v1/completions", headers={**PREFLIGHT, "Origin": "https://any.example"})
        assert r.status_code == 204 and cors_headers(r)["access-control-allow-origin"] == "*"
        r = await c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, headers={"Origin": "http://x"})
        assert r.status_code == 200 and cors_headers(r) == {"access-control-allow-origin": "*"}
    srv.shutdown.set()


async def test_keys_hold_over_http2(guarded: LiveServer) -> None:
    """hypercorn also speaks HTTP/2 (cleartext, prior knowledge): the key check reads the same
    routed path there, from the ``:path`` pseudo-header, and keep-alive streams share one connection."""
    async with httpx.AsyncClient(base_url=guarded.url, http1=False, http2=True, timeout=10) as client:
        for path in ("/v1/models", "//v1/models", "/v1/models/", "/%761/models", "/V1/MODELS", "/health/../v1/models"):
            r = await client.get(path)
            assert r.http_version == "HTTP/2" and r.status_code == 401, (path, r.status_code)
            assert r.json()["error"]["type"] == "Unauthorized"
        r = await client.post("/v1/completions", content=BODY, headers={"Content-Type": "application/json"})
        assert r.status_code == 401
        r = await client.post(
            "/v1/completions", content=BODY, headers={"Content-Type": "application/json", **bearer(KEYS[1])}
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
        assert (await client.get("/health")).status_code == 200
