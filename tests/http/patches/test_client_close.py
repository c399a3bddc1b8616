"""braid.http.patches.client_close: a connection the client ends is closed at once, not at the keep-alive timeout."""

from __future__ import annotations

import socket

import trio
import trio.testing

from tests.helpers import start_server

REQUEST = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"


async def read_response(stream: trio.SocketStream) -> bytes:
    got = b""
    while not got.endswith(b"\r\n0\r\n\r\n"):
        data = await stream.receive_some()
        assert data, "the server closed the connection mid-response"
        got += data
    return got


async def test_a_client_that_ends_an_idle_connection_is_answered_with_a_close(nursery: trio.Nursery) -> None:
    """One request, the whole response, then the client's FIN: the server's FIN follows at once
    (the keep-alive timeout is 75 s here; hypercorn alone waited for it)."""
    srv = await start_server(nursery, token_delay=0.0)
    host, port = srv.url.removeprefix("http://").split(":")
    stream = await trio.open_tcp_stream(host, int(port))
    body = b'{"prompt": "x", "stream": true, "max_tokens": 5, "ignore_eos": true}'
    await stream.send_all(REQUEST % (len(body), body))
    response = await read_response(stream)
    assert response.count(b"data: [DONE]") == 1
    stream.socket.shutdown(socket.SHUT_WR)
    start = trio.current_time()
    with trio.fail_after(5):
        assert await stream.receive_some() == b""  # the server's end of stream
    print(f"closed {1000 * (trio.current_time() - start):.1f} ms after the client's FIN")
    await stream.aclose()
    srv.shutdown.set()


async def test_a_closed_connection_leaves_no_task_behind(nursery: trio.Nursery) -> None:
    """50 clients, one request each, then close: the server ends up with no connection task."""
    srv = await start_server(nursery, token_delay=0.0)
    host, port = srv.url.removeprefix("http://").split(":")
    body = b'{"prompt": "x", "max_tokens": 3}'

    def tasks() -> int:
        def count(task: trio.lowlevel.Task) -> int:
            return 1 + sum(count(t) for n in task.child_nurseries for t in n.child_tasks)

        root = trio.lowlevel.current_root_task()
        assert root is not None  # inside a run
        return count(root)

    await trio.testing.wait_all_tasks_blocked()  # the accept loop and the drain trigger run
    idle = tasks()
    for _ in range(50):
        stream = await trio.open_tcp_stream(host, int(port))
        await stream.send_all(REQUEST % (len(body), body))
        got = b""
        while b"\r\n\r\n" not in got or not got.endswith(b"}"):
            got += await stream.receive_some()
        await stream.aclose()
    # Each close reaches the server on loopback, and its connection task ends, on no clock: done
    # once every task has been blocked for a moment (the keep-alive timeout, 75 s, is what the
    # tasks would wait for without the fix).
    with trio.fail_after(5):
        await trio.testing.wait_all_tasks_blocked(cushion=0.05)
    assert tasks() == idle
    srv.shutdown.set()
