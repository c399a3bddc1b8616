"""The access log and the forwarded-headers fix on a live server (braid.http.access_log,
braid.http.forwarded), with the logs routed as ``braid serve`` routes them (braid.logs.configure)
into strings: the access lines, and every other record."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from typing import Any

import attrs
import httpx
import pytest
import trio

from braid import logs
from braid.addresses import parse_allowed
from braid.http.access_log import MAX_VALUE_CHARS
from braid.http.forwarded import ForwardedFor
from tests.helpers import LiveServer, parse_sse, start_server

KEY = "key-one"


class WatchedText(io.StringIO):
    """A text stream that wakes its waiters at each write (a log handler writes on the Trio
    thread, as the request it logs ends)."""

    def __init__(self) -> None:
        super().__init__()
        self.written = trio.lowlevel.ParkingLot()

    def write(self, s: str) -> int:
        n = super().write(s)
        self.written.unpark_all()
        return n


@attrs.define
class Logs:
    format: logs.LogFormat
    access: WatchedText
    errors: io.StringIO

    def access_lines(self) -> list[str]:
        return self.access.getvalue().split("\n")[:-1]  # splitlines() would split at U+0085 too

    async def wait_access(self, count: int) -> list[dict[str, Any]]:
        """The fields of the first ``count`` access lines, once that many are written (a line is
        written when the app returns, just after the client has the response's last byte)."""
        with trio.fail_after(10):
            while len(self.access_lines()) < count:
                await self.access.written.park()
        lines = self.access_lines()
        assert len(lines) == count, lines
        return [parse(line, self.format) for line in lines]


_TEXT = re.compile(
    r'^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO braid\.access: (?P<remote>\S+) (?P<request>"(?:[^"\\]|\\.)*") '
    r"(?P<status>\d+|-) (?P<bytes>\d+)B (?P<ms>\d+\.\d)ms id=(?P<rid>\"(?:[^\"\\]|\\.)*\"|\S+) "
    r'(?P<ua>"(?:[^"\\]|\\.)*"|-)$'
)


def parse(line: str, fmt: logs.LogFormat) -> dict[str, Any]:
    """An access line's fields, from either format (a text line's quoted values are JSON strings)."""
    if fmt == "json":
        doc = json.loads(line)
        assert (doc["level"], doc["logger"]) == ("INFO", "braid.access")
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", doc["time"])
        assert isinstance(doc["message"], str) and "\n" not in doc["message"]
        return doc
    match = _TEXT.match(line)
    assert match, line
    method, _, path = json.loads(match["request"]).partition(" ")
    rid = match["rid"]
    return {
        "remote": match["remote"],
        "method": method,
        "path": path,
        "status": None if match["status"] == "-" else int(match["status"]),
        "bytes": int(match["bytes"]),
        "duration_ms": float(match["ms"]),
        "request_id": None if rid == "-" else json.loads(rid) if rid.startswith('"') else rid,
        "user_agent": None if match["ua"] == "-" else json.loads(match["ua"]),
    }


@pytest.fixture(params=["text", "json"])
def captured(request: pytest.FixtureRequest) -> Iterator[Logs]:
    """Every record at every level, routed by braid.logs.configure, in each format."""
    root, access = logging.getLogger(), logging.getLogger(logs.ACCESS_LOGGER)
    saved = (root.handlers[:], root.level, access.handlers[:], access.propagate)
    out = Logs(request.param, WatchedText(), io.StringIO())
    logs.configure(request.param, level=logging.DEBUG, errors=out.errors, access=out.access)
    try:
        yield out
    finally:
        root.handlers, root.level, access.handlers, access.propagate = saved


async def test_one_line_per_request_with_its_fields(nursery: trio.Nursery, captured: Logs) -> None:
    srv = await start_server(nursery, access_log=True)
    headers = {"User-Agent": "test-agent/1.0"}
    async with httpx.AsyncClient(base_url=srv.url, timeout=10, headers=headers) as c:
        health = await c.get("/health")
        whole = await c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 3}, headers={"X-Request-Id": "r-1"})
        async with c.stream("POST", "/v1/completions", json={"prompt": "Hi", "max_tokens": 3, "stream": True}) as r:
            streamed = await r.aread()
            stream_id = r.headers["x-request-id"]
        missing = await c.get("/v1/nope")
    lines = await captured.wait_access(4)
    expected = [
        ("GET", "/health", 200, 0, None),
        ("POST", "/v1/completions", 200, len(whole.content), "r-1"),
        ("POST", "/v1/completions", 200, len(streamed), stream_id),
        ("GET", "/v1/nope", 404, len(missing.content), None),
    ]
    assert health.status_code == 200 and whole.status_code == 200 and missing.status_code == 404
    assert stream_id.startswith("cmpl-") and parse_sse(streamed)[-1] == "[DONE]"
    for line, (method, path, status, size, request_id) in zip(lines, expected, strict=True):
        assert (line["method"], line["path"], line["status"], line["bytes"]) == (method, path, status, size)
        assert line["request_id"] == request_id
        assert line["remote"] == "127.0.0.1" and line["user_agent"] == "test-agent/1.0"
        assert 0 <= line["duration_ms"] < 10_000
    assert "braid.access" not in captured.errors.getvalue()  # the access log has its own stream


async def test_refusals_are_logged_and_odd_values_stay_on_one_line(nursery: trio.Nursery, captured: Logs) -> None:
    srv = await start_server(nursery, access_log=True, api_keys=(KEY,))
    odd_id = 'a "quoted" id\\ é\t\x85'  # latin-1 bytes, as a header's are decoded
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as c:
        refused = await c.get("/v1/models", headers={b"X-Request-Id": odd_id.encode("latin-1")})
        missing = await c.get("/%0Anope", headers={"Authorization": f"Bearer {KEY}", "User-Agent": 'ua "x"'})
        long = await c.get("/" + "p" * 5000, headers={"X-Request-Id": "i" * 5000, "User-Agent": "u" * 5000})
    assert (refused.status_code, missing.status_code, long.status_code) == (401, 404, 401)
    first, second, third = await captured.wait_access(3)
    assert [len(third[name]) for name in ("path", "request_id", "user_agent")] == [MAX_VALUE_CHARS + 3] * 3
    assert third["request_id"] == "i" * MAX_VALUE_CHARS + "..."
    assert (first["status"], first["path"], first["request_id"]) == (401, "/v1/models", odd_id)
    assert (second["status"], second["path"], second["user_agent"]) == (404, "/%0Anope", 'ua "x"')
    if captured.format == "text":
        assert all(line.isascii() and line.isprintable() for line in captured.access_lines())


async def request_from(srv: LiveServer, source: str, forwarded: str | None, extra: str = "") -> None:
    """GET /health from the local address ``source``, with ``X-Forwarded-For: forwarded``."""
    host, port = srv.url.removeprefix("http://").split(":")
    header = "" if forwarded is None else f"X-Forwarded-For: {forwarded}\r\n"
    stream = await trio.open_tcp_stream(host, int(port), local_address=source)
    async with stream:
        await stream.send_all(f"GET /health HTTP/1.1\r\nHost: h\r\n{header}{extra}Connection: close\r\n\r\n".encode())
        received = b""
        with trio.fail_after(10):
            while chunk := await stream.receive_some():
                received += chunk
    assert received.startswith(b"HTTP/1.1 200"), received[:80]


async def test_the_forwarded_client_only_from_an_allowed_peer(nursery: trio.Nursery, captured: Logs) -> None:
    """One server trusting 127.0.0.2 (the proxy) and 10.0.0.0/8 (proxies behind it); the same
    headers from 127.0.0.1, a client that reaches braid directly, change nothing."""
    srv = await start_server(nursery, access_log=True, forwarded_allow_ips=("127.0.0.2", "10.0.0.0/8"))
    cases = [
        ("127.0.0.2", "198.51.100.7", "198.51.100.7"),
        ("127.0.0.2", "203.0.113.9, 198.51.100.7", "198.51.100.7"),  # the client's own claim skipped
        ("127.0.0.2", "198.51.100.7, 10.1.2.3", "198.51.100.7"),  # a trusted proxy skipped
        ("127.0.0.2", "10.1.2.3", "10.1.2.3"),  # all trusted: the leftmost
        ("127.0.0.2", None, "127.0.0.2"),
        ("127.0.0.1", "198.51.100.7", "127.0.0.1"),
        ("127.0.0.1", None, "127.0.0.1"),
    ]
    for source, forwarded, _ in cases:
        await request_from(srv, source, forwarded)
    lines = await captured.wait_access(len(cases))
    assert [line["remote"] for line in lines] == [remote for _, _, remote in cases]


async def test_any_peer_with_a_star_and_none_by_default(nursery: trio.Nursery, captured: Logs) -> None:
    star = await start_server(nursery, access_log=True, forwarded_allow_ips=("*",))
    await request_from(star, "127.0.0.1", "203.0.113.9, 198.51.100.7")
    default = await start_server(nursery, access_log=True)
    await request_from(default, "127.0.0.1", "198.51.100.7")
    lines = await captured.wait_access(2)
    assert [line["remote"] for line in lines] == ["203.0.113.9", "127.0.0.1"]


async def test_the_forwarded_scheme_reaches_the_app() -> None:
    seen: list[tuple[Any, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append((scope["client"], scope["scheme"]))

    fix = ForwardedFor(app, ["10.0.0.1"])
    headers = [(b"X-Forwarded-For", b"198.51.100.7"), (b"x-forwarded-proto", b"https")]
    scope = {"type": "http", "client": ("10.0.0.1", 5), "scheme": "http", "headers": headers}
    await fix(scope, None, None)  # type: ignore[arg-type]
    await fix({**scope, "client": ("10.0.0.2", 5)}, None, None)  # type: ignore[arg-type]
    await fix({**scope, "headers": [(b"x-forwarded-proto", b"gopher")]}, None, None)  # type: ignore[arg-type]
    assert seen == [(("198.51.100.7", 0), "https"), (("10.0.0.2", 5), "http"), (("10.0.0.1", 5), "http")]
    assert scope["client"] == ("10.0.0.1", 5)  # the server's own scope is left as it was


def test_forwarded_entries_with_ports() -> None:
    fix = ForwardedFor(lambda *_: None, ["10.0.0.0/8", "::1"])  # type: ignore[arg-type, return-value]
    assert fix.client(["198.51.100.7:5678", "10.0.0.1:80"]) == ("198.51.100.7", 5678)
    assert fix.client(["[2001:db8::7]:443", "[::1]:80"]) == ("2001:db8::7", 443)
    assert fix.client(["2001:db8::7", "::1"]) == ("2001:db8::7", 0)
    assert fix.client(["10.0.0.1", "unknown"]) == ("unknown", 0)  # not an address: not trusted
    assert fix.client(["10.0.0.1:x"]) == ("10.0.0.1:x", 0)
    assert fix.client(["[::1]x", "10.0.0.2"]) == ("[::1]x", 0)
    assert fix.client([]) is None


def test_allowed_peers_are_addresses_or_networks() -> None:
    assert parse_allowed([" 127.0.0.1", "::1", "10.1.2.3/8", "*"]) == ("127.0.0.1", "::1", "10.0.0.0/8", "*")
    for bad in ("localhost", "10.0.0.0/33", "1.2.3", ""):
        with pytest.raises(ValueError):
            parse_allowed([bad])


SECRET = "zebra-umbrella-4711"


async def test_no_prompt_text_in_any_log_line(nursery: trio.Nursery, captured: Logs) -> None:
    """Completions with a recognisable prompt, whole and streamed, succeeding and failing, with
    every logger at DEBUG: the prompt appears in no line, access or other."""
    srv = await start_server(nursery, access_log=True)
    bodies: list[dict[str, Any]] = [
        {"prompt": SECRET, "max_tokens": 3},
        {"prompt": [SECRET, SECRET + "2"], "max_tokens": 3, "stream": True},
        {"prompt": f"{SECRET} braid:fail@2", "max_tokens": 5},  # an engine failure: a 500
        {"prompt": f"{SECRET} braid:fail@2", "max_tokens": 5, "stream": True},  # an SSE error event
        {"prompt": f"{SECRET} braid:invalid", "max_tokens": 5},  # the engine rejects it: a 400
        {"prompt": SECRET, "max_tokens": "many"},  # the schema: a 400
        {"prompt": SECRET, "model": SECRET},  # an unknown model: a 404
    ]
    statuses = []
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as c:
        for body in bodies:
            r = await c.post("/v1/completions", json=body, headers={"User-Agent": "t"})
            statuses.append(r.status_code)
            if body.get("stream"):
                assert parse_sse(r.content)[-1] == "[DONE]"
        r = await c.post("/v1/completions", content=SECRET.encode(), headers={"Content-Type": "application/json"})
        statuses.append(r.status_code)  # not JSON: a 400
    assert statuses == [200, 200, 500, 200, 400, 400, 404, 400]
    lines = await captured.wait_access(len(bodies) + 1)
    assert [line["status"] for line in lines] == statuses
    everything = captured.access.getvalue() + captured.errors.getvalue()
    assert SECRET not in everything
    assert SECRET.encode().hex() not in everything and json.dumps(SECRET)[1:-1] not in everything


async def test_without_the_flag_nothing_is_logged_per_request(nursery: trio.Nursery, captured: Logs) -> None:
    srv = await start_server(nursery)
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as c:
        assert (await c.get("/health")).status_code == 200
    await trio.sleep(0.05)
    assert captured.access_lines() == []


def test_error_records_in_json_carry_the_exception() -> None:
    formatter = logs.formatter("json")
    try:
        raise RuntimeError("boom")
    except RuntimeError as exc:
        record = logging.getLogger("braid").makeRecord("braid", logging.ERROR, "f", 1, "failed %d", (3,), None)
        record.exc_info = (type(exc), exc, exc.__traceback__)
    doc = json.loads(formatter.format(record))
    assert (doc["level"], doc["logger"], doc["message"]) == ("ERROR", "braid", "failed 3")
    assert "RuntimeError: boom" in doc["exception"] and "Traceback" in doc["exception"]
    assert set(doc) == {"time", "level", "logger", "message", "exception"}
