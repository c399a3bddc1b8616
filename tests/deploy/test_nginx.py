"""braid behind a real nginx (docs/nginx.conf, as docs/deploy.md gives it), with two replicas.

Each replica is ``braid serve --engine scripted`` in its own process (the engine does not matter
here: what is checked is what crosses the proxy), with an API key, its access log in JSON and
nginx's address allowed to forward the client's. nginx is Debian's package, installed by
:func:`tools.nginx.nginx_binary` when missing. The timeouts docs/nginx.conf orders against braid's
are scaled down (nginx's upstream keep-alive 1 s, braid's 3 s) so the order can be watched.

Timing bounds are generous for a busy 2-core machine and far from what the defect each test
targets would take.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import attrs
import httpx
import pytest

from tests.helpers import parse_sse
from tools.nginx import Nginx, render_site, run_nginx
from tools.servers import ServerProcess, free_port, run_scripted_braid

KEY = "test-key-" + uuid.uuid4().hex
AUTH = {"Authorization": f"Bearer {KEY}"}
BRAID_KEEP_ALIVE = 3.0
NGINX_KEEP_ALIVE = 1.0
# What each replica runs with: paced tokens (10 ms each), the key, the proxy allowed to forward.
REPLICA_ARGS = (
    "--token-delay",
    "0.01",
    "--keep-alive",
    str(BRAID_KEEP_ALIVE),
    "--metrics-public",
    "--access-log",
    "--log-format",
    "json",
    "--forwarded-allow-ips",
    "127.0.0.1",
)
ABORTED_WITHIN = 2.0


@attrs.frozen
class Deployment:
    nginx: Nginx
    replicas: tuple[ServerProcess, ...]

    @property
    def url(self) -> str:
        return self.nginx.url

    def ports(self) -> set[int]:
        return {int(r.url.rsplit(":", 1)[1]) for r in self.replicas}

    def total(self, metric: str) -> float:
        return sum(r.metrics().get(metric, 0.0) for r in self.replicas if r.proc.poll() is None)

    def wait_idle(self, within: float) -> float:
        start = time.monotonic()
        while self.total("braid_engine_requests_in_flight") or self.total("braid_engine_unfinished_requests"):
            if time.monotonic() - start > within:
                pytest.fail(f"engine requests still in flight {within} s after the client left")
            time.sleep(0.005)
        return time.monotonic() - start


@contextmanager
def _deploy(tmp: Path, replica_args: tuple[str, ...], nginx_keep_alive: float) -> Iterator[Deployment]:
    with ExitStack() as stack:
        replicas = tuple(
            stack.enter_context(run_scripted_braid(*replica_args, api_key=KEY, log=tmp / f"replica{i}.log"))
            for i in range(2)
        )
        listen = free_port()
        ports = [int(r.url.rsplit(":", 1)[1]) for r in replicas]
        site = render_site(ports, listen, {"keepalive_timeout": f"{nginx_keep_alive:g}s"})
        nginx = stack.enter_context(run_nginx(site, listen, tmp / "nginx"))
        yield Deployment(nginx, replicas)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with _deploy(tmp_path_factory.mktemp("deploy"), REPLICA_ARGS, NGINX_KEEP_ALIVE) as d:
        yield d


def _stream_body(prompt: str | list[str], max_tokens: int) -> dict[str, object]:
    return {"prompt": prompt, "stream": True, "max_tokens": max_tokens, "ignore_eos": True}


def test_the_documented_config_passes_nginx_t(deployment: Deployment) -> None:
    # run_nginx runs `nginx -t` first; this checks the proxy answers with the replicas behind it
    r = httpx.get(deployment.url + "/v1/models", headers=AUTH)
    assert r.status_code == 200 and r.json()["data"][0]["id"] == "scripted"


def test_streams_are_not_buffered(deployment: Deployment) -> None:
    """The first event arrives as it is made, long before the last (100 tokens, 10 ms each)."""
    arrivals: list[float] = []
    body = b""
    start = time.monotonic()
    with httpx.stream(
        "POST", deployment.url + "/v1/completions", json=_stream_body("x", 100), headers=AUTH, timeout=10
    ) as r:
        assert r.status_code == 200
        for chunk in r.iter_raw():
            arrivals.append(time.monotonic() - start)
            body += chunk
    events = parse_sse(body)
    assert events[-1] == "[DONE]" and len(events) == 101
    # buffered, the whole body (under nginx's 4-8 KiB buffers) would come at once at the end
    assert len(arrivals) >= 20, len(arrivals)
    assert arrivals[0] < arrivals[-1] / 4, (arrivals[0], arrivals[-1])


def test_a_client_disconnect_at_nginx_aborts_the_engine_work(deployment: Deployment) -> None:
    aborts_before = deployment.total("braid_engine_aborts_total")
    with httpx.stream(
        "POST",
        deployment.url + "/v1/completions",
        json=_stream_body([f"p{i}" for i in range(8)], 2000),  # 20 s of tokens
        headers=AUTH,
        timeout=10,
    ) as r:
        chunks = r.iter_raw()  # kept: a generator dropped early closes the response
        seen = 0
        while seen < 20:
            seen += next(chunks).count(b"\n\n")
        assert deployment.total("braid_engine_requests_in_flight") == 8
    # leaving the block closed the client's connection to nginx, mid-stream
    took = deployment.wait_idle(ABORTED_WITHIN)
    assert deployment.total("braid_engine_aborts_total") - aborts_before == 8
    print(f"engine idle {took * 1000:.0f} ms after the client left nginx")


def test_the_client_address_reaches_the_access_log(deployment: Deployment) -> None:
    """nginx adds the client's address to X-Forwarded-For; braid trusts it from nginx's address
    only, and logs it. The client connects from 127.0.0.2 so it differs from nginx's 127.0.0.1."""
    request_id = "xff-" + uuid.uuid4().hex
    transport = httpx.HTTPTransport(local_address="127.0.0.2")
    with httpx.Client(transport=transport, timeout=10) as client:
        r = client.post(
            deployment.url + "/v1/completions",
            json={"prompt": "x", "max_tokens": 2},
            headers={**AUTH, "X-Request-Id": request_id},
        )
    assert r.status_code == 200 and r.headers["X-Request-Id"] == request_id
    line = _access_line(deployment, request_id)
    assert line["remote"] == "127.0.0.2", line
    assert line["status"] == 200 and line["path"] == "/v1/completions", line
    # a direct client cannot claim another address: only nginx's is allowed to forward
    spoof = "spoof-" + uuid.uuid4().hex
    direct = deployment.replicas[0].url
    with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.3"), timeout=10) as client:
        client.get(direct + "/v1/models", headers={**AUTH, "X-Forwarded-For": "203.0.113.9", "X-Request-Id": spoof})
    assert _access_line(deployment, spoof)["remote"] == "127.0.0.3"


def _access_line(deployment: Deployment, request_id: str) -> dict[str, object]:
    deadline = time.monotonic() + 5
    while True:
        for replica in deployment.replicas:
            for raw in replica.log.read_text(errors="replace").splitlines():
                if request_id in raw and raw.startswith("{"):
                    line = json.loads(raw)
                    if line.get("request_id") == request_id:
                        return dict(line)
        if time.monotonic() > deadline:
            pytest.fail(f"no access line with {request_id} in the replicas' logs")
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("method", "path", "headers", "status"),
    [
        ("POST", "/v1/completions", {}, 401),
        ("POST", "/v1/completions", {"Authorization": "Bearer wrong"}, 401),
        ("POST", "/v1/completions", AUTH, 200),
        ("GET", "/v1/models", {}, 401),
        ("GET", "//v1/models", {}, 401),
        ("GET", "/v1/models", {"Host": "health"}, 401),
        # nginx refuses a Host with a path in it before braid sees it (braid also would: its key
        # check reads the routed path, never the Host header)
        ("GET", "/v1/models", {"Host": "example.com/health"}, 400),
        ("GET", "/health", {}, 200),
        ("GET", "/version", AUTH, 200),
    ],
)
def test_api_keys_hold_through_the_proxy(
    deployment: Deployment, method: str, path: str, headers: dict[str, str], status: int
) -> None:
    body = {"prompt": "x", "max_tokens": 1} if method == "POST" else None
    r = httpx.request(method, deployment.url + path, json=body, headers=headers, timeout=10)
    assert r.status_code == status, r.text
    if status == 401:
        assert r.json()["error"]["code"] == 401


# --- idle upstream connections: nginx must close them before braid does --------------------------


def _tcp_states(ports: set[int]) -> tuple[int, int, int]:
    """(connections to these ports established from a client's side, TIME_WAIT sockets on the
    client's side, TIME_WAIT sockets on the server's side), from /proc/net/tcp. The side that
    closes a TCP connection first is the one left in TIME_WAIT."""
    established = client_tw = server_tw = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for row in rows:
            fields = row.split()
            local, remote, state = int(fields[1].rsplit(":", 1)[1], 16), int(fields[2].rsplit(":", 1)[1], 16), fields[3]
            if remote in ports and state == "01":
                established += 1
            elif remote in ports and state == "06":
                client_tw += 1
            elif local in ports and state == "06":
                server_tw += 1
    return established, client_tw, server_tw


def test_nginx_closes_idle_upstream_connections_before_braid(deployment: Deployment) -> None:
    ports = deployment.ports()
    with httpx.Client(timeout=10) as client:
        for _ in range(4):
            assert client.get(deployment.url + "/version", headers=AUTH).status_code == 200
    established, _, server_tw_before = _tcp_states(ports)
    assert established >= 1, "nginx kept no upstream connection open"
    time.sleep(NGINX_KEEP_ALIVE + 1.2)  # past nginx's keep-alive, before braid's
    after, _, server_tw_after = _tcp_states(ports)
    assert after == 0, "an idle upstream connection outlived nginx's keep-alive timeout"
    # closed by nginx (its side is in TIME_WAIT), none by braid, so none was closed by braid under
    # a request nginx was sending on it: the 502 on reuse cannot happen
    assert server_tw_after == server_tw_before


def test_the_close_order_check_sees_the_wrong_order(tmp_path: Path) -> None:
    """The check above can fail: with nginx's keep-alive longer than braid's, braid closes first."""
    with _deploy(tmp_path, REPLICA_ARGS, BRAID_KEEP_ALIVE + 2) as deployment:
        ports = deployment.ports()
        with httpx.Client(timeout=10) as client:
            assert client.get(deployment.url + "/version", headers=AUTH).status_code == 200
        _, _, server_tw_before = _tcp_states(ports)
        time.sleep(BRAID_KEEP_ALIVE + 1.0)
        _, _, server_tw_after = _tcp_states(ports)
        assert server_tw_after > server_tw_before


# --- a replica drained under load ------------------------------------------------------------------


def test_a_replica_drained_mid_load_fails_no_request(tmp_path: Path) -> None:
    """Eight clients send short requests (streamed and not) through nginx for 4 s; one replica
    gets SIGTERM after 1 s. Its in-flight requests finish, new ones go to the other replica
    (refused connects and 503s are retried by proxy_next_upstream), and no client sees a failure."""
    args = (*REPLICA_ARGS, "--graceful-timeout", "5")
    with _deploy(tmp_path, args, NGINX_KEEP_ALIVE) as deployment:
        drained, other = deployment.replicas
        stop = threading.Event()
        failures: list[str] = []
        done = [0]
        lock = threading.Lock()

        def client(k: int) -> None:
            with httpx.Client(base_url=deployment.url, headers=AUTH, timeout=10) as c:
                i = 0
                while not stop.is_set():
                    i += 1
                    stream = (i + k) % 2 == 0
                    try:
                        if stream:
                            with c.stream("POST", "/v1/completions", json=_stream_body(f"c{k}", 20)) as r:
                                raw = r.read()
                            ok = r.status_code == 200 and raw.endswith(b"data: [DONE]\n\n") and b'"error"' not in raw
                            what = f"{r.status_code} {raw[-200:]!r}"
                        else:
                            r = c.post(
                                "/v1/completions", json={"prompt": f"c{k}", "max_tokens": 20, "ignore_eos": True}
                            )
                            ok = r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 20
                            what = f"{r.status_code} {r.text[:200]}"
                    except httpx.HTTPError as exc:
                        ok, what = False, repr(exc)
                    with lock:
                        done[0] += 1
                        if not ok:
                            failures.append(f"client {k} {'stream' if stream else 'json'}: {what}")

        threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        try:
            time.sleep(1.0)
            served_before = drained.metrics().get("braid_http_responses_total", 0.0)
            drained.proc.send_signal(signal.SIGTERM)
            exit_code = drained.proc.wait(15)
            time.sleep(0.5)  # requests after the exit go to the other replica alone
        finally:
            stop.set()
            for t in threads:
                t.join(30)
        assert exit_code == 0
        assert not failures, f"{len(failures)} of {done[0]} requests failed: {failures[:5]}"
        assert served_before > 0 and other.metrics()["braid_http_responses_total"] > 0
        assert done[0] >= 40, done[0]
        print(f"{done[0]} requests, none failed; the drained replica exited 0")
