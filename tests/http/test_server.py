"""braid.http.server: the options it hands hypercorn reach the listening socket and the connections."""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial

import attrs
import httpx
import pytest
import trio
import trio.testing

from braid.cli.config import server_config_from
from braid.cli.parser import build_parser
from braid.engine.scripted import ScriptedEngine
from braid.http.app import create_app
from braid.http.patches import PatchOptions
from braid.http.server import ServerConfig, hypercorn_config, serve
from braid.settings import Settings
from braid.stream.admit import Ticket
from tests.helpers import LiveServer, listen_queue, parse_sse, start_server

SHORT = {"max_tokens": 30, "ignore_eos": True}
LONG = {"max_tokens": 2000, "ignore_eos": True}


@pytest.mark.parametrize("backlog", [37, None])
async def test_the_listen_backlog_reaches_the_socket(nursery: trio.Nursery, backlog: int | None) -> None:
    cfg = ServerConfig(port=0) if backlog is None else ServerConfig(port=0, backlog=backlog)
    shutdown = trio.Event()
    (url,) = await nursery.start(
        partial(serve, create_app(ScriptedEngine()), cfg, shutdown=shutdown, handle_signals=False)
    )
    port = int(url.rsplit(":", 1)[1])
    # The default is uvicorn's (vLLM's server), not hypercorn's 100.
    assert listen_queue(port)[1] == (backlog or 2048)
    shutdown.set()


def test_the_write_timeout_defaults_to_the_stall_timeout() -> None:
    assert ServerConfig().write_timeout == Settings().stall_timeout
    config = hypercorn_config(ServerConfig(write_timeout=2.5))
    assert config.write_deadlines is not None and config.write_deadlines.timeout == 2.5


def test_stock_send_turns_off_the_fast_send_and_nothing_else() -> None:
    """Every patch is on by default; ``--stock-send`` is the fast send's switch alone
    (tests/http/patches/test_install.py: each switch installs or leaves out its patch only)."""
    assert server_config_from(build_parser().parse_args(["serve"])).patch_options == PatchOptions()
    stock = server_config_from(build_parser().parse_args(["serve", "--stock-send"]))
    assert stock.patch_options == PatchOptions(fast_send=False)
    both = ServerConfig(fast_send=False, patches=PatchOptions(h11_body=False))
    assert both.patch_options == PatchOptions(fast_send=False, h11_body=False)


def test_server_config_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        ServerConfig(write_timeout=0)
    with pytest.raises(ValueError):
        ServerConfig(backlog=0)
    assert attrs.evolve(ServerConfig(), backlog=1).backlog == 1


# --- the drain (braid.http.server.serve) ---------------------------------------------------------------
# Bounds run against a real server on a machine that may be busy: generous above what the
# behaviour takes, far below what the defect would (a long request generates for 10 s or more).


async def _drain_started(srv: LiveServer) -> None:
    srv.shutdown.set()
    # serve() wakes on the event and marks the app draining, on no clock and no socket: done by
    # the time every task is blocked
    await trio.testing.wait_all_tasks_blocked()
    assert srv.app.state.draining


async def _queued(srv: LiveServer, count: int) -> None:
    """Wait until ``count`` requests wait for their first engine slot, checked at each move of
    the admission (a request counts as queued when admitted, and then asks for its slot)."""
    admission = srv.app.state.admission
    moved = trio.lowlevel.ParkingLot()

    def observe(_move: str, _ticket: Ticket, _slots: int) -> None:
        moved.unpark_all()

    admission.observer = observe
    try:
        with trio.fail_after(5):
            while admission.queued != count:
                await moved.park()
    finally:
        admission.observer = None


async def _first_event(r: httpx.Response) -> AsyncIterator[bytes]:
    chunks = r.aiter_raw()
    buf = b""
    while b"\n\n" not in buf:
        buf += await chunks.__anext__()
    return chunks


async def test_a_drain_refuses_new_connections_and_answers_503_on_open_ones(nursery: trio.Nursery) -> None:
    srv = await start_server(nursery, token_delay=0.01, graceful_timeout=5.0)
    port = int(srv.url.rsplit(":", 1)[1])
    async with httpx.AsyncClient(base_url=srv.url) as client, httpx.AsyncClient(base_url=srv.url) as other:
        assert (await other.get("/health")).status_code == 200  # an open keep-alive connection
        async with client.stream("POST", "/v1/completions", json={"prompt": "x", "stream": True, **SHORT}) as r:
            chunks = await _first_event(r)
            await _drain_started(srv)
            # hypercorn's accept loop ends and closes the listening socket: refused, not queued
            # in the backlog until the process exits (a proxy retries a refused connect at once)
            sock = trio.socket.socket()
            with pytest.raises(ConnectionRefusedError):
                await sock.connect(("127.0.0.1", port))
            sock.close()
            # hypercorn closes idle keep-alive connections; a request that still gets through on
            # one is answered 503, never run
            try:
                late = await other.post("/v1/completions", json={"prompt": "late"})
            except httpx.TransportError:
                pass
            else:
                assert late.status_code == 503 and late.headers["Retry-After"] == "5"
            body = b"".join([c async for c in chunks])
        assert body.endswith(b"data: [DONE]\n\n") and b'"error"' not in body  # the stream finished
    with trio.fail_after(5):
        await srv.stopped.wait()
    assert srv.gauge("braid_engine_requests_total") == 1


async def test_queued_requests_run_during_a_drain(nursery: trio.Nursery) -> None:
    """Admitted work is not dropped by a drain that has time for it: a request waiting for its
    engine slot when the drain starts runs once the slot frees up."""
    srv = await start_server(nursery, token_delay=0.01, graceful_timeout=5.0, max_in_flight=1)
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:

        async def second(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            task_status.started()
            r = await client.post("/v1/completions", json={"prompt": "queued", "max_tokens": 5})
            results.append(r)

        results: list[httpx.Response] = []
        async with client.stream("POST", "/v1/completions", json={"prompt": "x", "stream": True, **SHORT}) as r:
            chunks = await _first_event(r)
            async with trio.open_nursery() as inner:
                await inner.start(second)
                await _queued(srv, 1)
                await _drain_started(srv)
                body = b"".join([c async for c in chunks])
    assert body.endswith(b"data: [DONE]\n\n") and b'"error"' not in body
    (queued,) = results
    assert queued.status_code == 200 and queued.json()["usage"]["completion_tokens"] == 5
    assert srv.engine.finished_total == 2 and srv.engine.aborted_total == 0


@pytest.mark.parametrize("stream", [True, False])
async def test_a_drain_out_of_time_ends_running_and_queued_requests(nursery: trio.Nursery, stream: bool) -> None:
    """At the drain's end every run still open fails with a 503 its client can read: the one in
    the engine is aborted, the one waiting for a slot never reaches it, and nothing stays queued."""
    srv = await start_server(nursery, token_delay=0.01, graceful_timeout=1.0, max_in_flight=1)
    bodies: dict[str, httpx.Response | bytes] = {}
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:

        async def post(name: str) -> None:
            body = {"prompt": name, "stream": stream, **LONG}
            if stream:
                async with client.stream("POST", "/v1/completions", json=body) as r:
                    bodies[name] = await r.aread()
            else:
                bodies[name] = await client.post("/v1/completions", json=body)

        async with trio.open_nursery() as inner:
            inner.start_soon(post, "running")
            with trio.fail_after(5):
                await srv.engine.wait_until(lambda: srv.engine.in_flight == 1)
            inner.start_soon(post, "queued")
            await _queued(srv, 1)
            start = trio.current_time()
            await _drain_started(srv)
        took = trio.current_time() - start
    assert 0.7 <= took <= 5.0, took
    for name, answer in bodies.items():
        if stream:
            assert isinstance(answer, bytes)
            events = parse_sse(answer)
            assert events[-1] == "[DONE]", name
            error = events[-2]["error"]
        else:
            assert isinstance(answer, httpx.Response)
            assert answer.status_code == 503 and answer.headers["Retry-After"] == "5", name
            error = answer.json()["error"]
        assert error["code"] == 503 and "shut down" in error["message"], (name, error)
    assert srv.gauge("braid_engine_requests_total") == 1 and srv.engine.aborted_total == 1 and srv.engine.in_flight == 0
    assert srv.app.state.admission.queued == 0 and srv.app.state.admission.in_use == 0
    with trio.fail_after(5):
        await srv.stopped.wait()
