"""braid.http.patches: one installer, one switch per patch, and a server that serves with any one off."""

from __future__ import annotations

import importlib
from functools import partial

import attrs
import httpx
import hypercorn.protocol
import hypercorn.trio.run
import pytest
import trio
from hypercorn.protocol.h2 import H2Protocol
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.tcp_server import TCPServer
from quart_trio import QuartTrio
from quart_trio.asgi import TrioASGIHTTPConnection

from braid.engine.scripted import ScriptedEngine
from braid.http.app import create_app
from braid.http.patches import PATCHES, PatchOptions, PatchSettings, installed
from braid.http.patches.client_close import ClientCloseTCPServer
from braid.http.patches.fast_send import FastSendTCPServer
from braid.http.patches.final_send import ShieldedFinalSendConnection
from braid.http.patches.h2_late_data import LateDataH2Protocol
from braid.http.patches.h11_body import DirectBodyH11Protocol
from braid.http.patches.isolate import IsolatedTCPServer
from braid.http.patches.keep_alive import KeepAliveTCPServer
from braid.http.patches.locked_send import LockedSendTCPServer
from braid.http.patches.write_deadline import WriteDeadlineTCPServer
from braid.http.server import ServerConfig, serve
from tests.helpers import parse_sse

NAMES = [patch.name for patch in PATCHES]


def in_place() -> dict[str, bool]:
    """Which patches hypercorn, trio and quart-trio see now, each found where upstream looks."""
    tcp = hypercorn.trio.run.TCPServer
    return {
        "accept": hypercorn.trio.run.trio is not trio,
        "isolate": issubclass(tcp, IsolatedTCPServer),
        "keep_alive": issubclass(tcp, KeepAliveTCPServer),
        "client_close": issubclass(tcp, ClientCloseTCPServer),
        "write_deadline": issubclass(tcp, WriteDeadlineTCPServer),
        "fast_send": issubclass(tcp, FastSendTCPServer),
        "h11_body": issubclass(hypercorn.protocol.H11Protocol, DirectBodyH11Protocol),
        "h2_late_data": issubclass(hypercorn.protocol.H2Protocol, LateDataH2Protocol),
        "final_send": issubclass(QuartTrio.asgi_http_class, ShieldedFinalSendConnection),
    }


def upstream_in_place() -> bool:
    return (
        hypercorn.trio.run.trio is trio
        and hypercorn.trio.run.TCPServer is TCPServer
        and hypercorn.protocol.H11Protocol is H11Protocol
        and hypercorn.protocol.H2Protocol is H2Protocol
        and QuartTrio.asgi_http_class is TrioASGIHTTPConnection
    )


def test_one_switch_per_patch_named_as_the_patch_in_install_order() -> None:
    assert [field.name for field in attrs.fields(PatchOptions)] == NAMES == list(in_place())
    for patch in PATCHES:
        module = importlib.import_module(patch.module)
        assert module.PATCH is patch and module.__doc__, patch.name


def test_every_patch_is_on_by_default_and_upstream_is_back_after() -> None:
    assert upstream_in_place()
    with installed():
        assert all(in_place().values())
    assert upstream_in_place()


def test_the_tcp_server_patches_stack_in_install_order() -> None:
    with installed():
        mro = hypercorn.trio.run.TCPServer.__mro__
    ours = [cls for cls in mro if cls.__module__.startswith("braid.") and cls.__name__ == cls.__qualname__]
    order = [FastSendTCPServer, WriteDeadlineTCPServer, ClientCloseTCPServer, KeepAliveTCPServer, IsolatedTCPServer]
    assert [cls for cls in ours if cls in order] == order  # fast send's super() is the write deadline
    assert mro.index(LockedSendTCPServer) < mro.index(TCPServer) == len(mro) - 2


@pytest.mark.parametrize("name", NAMES)
def test_each_switch_turns_off_its_patch_and_nothing_else(name: str) -> None:
    with installed(PatchOptions().without(name)):
        assert in_place() == {n: n != name for n in NAMES}
    with installed(PatchOptions.only(name)):
        assert in_place() == {n: n == name for n in NAMES}
    assert upstream_in_place()


def test_options_refuse_an_unknown_patch() -> None:
    with pytest.raises(ValueError, match="no such patch: fast_sned"):
        PatchOptions().without("fast_sned")


def test_blocks_share_one_installation_until_the_last_ends() -> None:
    """Two servers in one process, whose blocks need not end in the order they began."""
    first = installed()
    first.__enter__()
    tcp = hypercorn.trio.run.TCPServer
    second = installed()
    second.__enter__()
    assert hypercorn.trio.run.TCPServer is tcp  # not stacked twice
    first.__exit__(None, None, None)
    assert hypercorn.trio.run.TCPServer is tcp  # the second server still runs on it
    second.__exit__(None, None, None)
    assert upstream_in_place()


def test_a_second_installation_must_be_the_same() -> None:
    with installed():
        with pytest.raises(RuntimeError, match="process-wide"), installed(PatchOptions(fast_send=False)):
            pass
        with pytest.raises(RuntimeError, match="process-wide"), installed(settings=PatchSettings(accept_batch=2)):
            pass
        assert all(in_place().values())
    assert upstream_in_place()


def test_a_failed_installation_puts_back_what_it_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    class NotAProtocol:
        pass

    monkeypatch.setattr(hypercorn.protocol, "H2Protocol", NotAProtocol)
    with pytest.raises(TypeError, match="LateDataH2Protocol patches H2Protocol"), installed():
        pass
    assert hypercorn.trio.run.TCPServer is TCPServer and hypercorn.protocol.H11Protocol is H11Protocol
    assert hypercorn.protocol.H2Protocol is NotAProtocol
    monkeypatch.undo()
    with installed():  # and the next installation starts afresh
        assert all(in_place().values())
    assert upstream_in_place()


# --- a live server with each patch off ----------------------------------------------------------------

OFF = [pytest.param(PatchOptions().without(name), id=f"{name}-off") for name in NAMES]
OFF.append(pytest.param(PatchOptions.only(), id="all-off"))


@pytest.mark.parametrize("options", OFF)
async def test_the_server_serves_with_a_patch_off(nursery: trio.Nursery, options: PatchOptions) -> None:
    shutdown, stopped = trio.Event(), trio.Event()

    async def run(task_status: trio.TaskStatus[list[str]]) -> None:
        cfg = ServerConfig(port=0, graceful_timeout=1.0, patches=options)
        try:
            await serve(
                create_app(ScriptedEngine()), cfg, shutdown=shutdown, handle_signals=False, task_status=task_status
            )
        finally:
            stopped.set()

    (url,) = await nursery.start(run)
    assert in_place() == attrs.asdict(options)
    body = {"prompt": ["a", "b"], "stream": True, "max_tokens": 20, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        r = await client.post("/v1/completions", json=body)
        assert r.status_code == 200
        events = parse_sse(r.content)
        assert events[-1] == "[DONE]" and sum(isinstance(e, dict) for e in events) == 40
        r = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 3})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3  # a Content-Length body
    async with httpx.AsyncClient(base_url=url, http1=False, http2=True, timeout=10) as client:
        r = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 3})
        assert r.http_version == "HTTP/2" and r.status_code == 200
    shutdown.set()
    with trio.fail_after(5):
        await stopped.wait()
    assert upstream_in_place()


@pytest.mark.parametrize(
    ("options", "closes"),
    [
        (PatchOptions().without("keep_alive"), True),
        (PatchOptions().without("final_send"), True),
        (PatchOptions().without("keep_alive", "final_send"), False),
    ],
    ids=["final_send-alone", "keep_alive-alone", "neither"],
)
async def test_an_idle_connection_is_closed_at_the_keep_alive_timeout(
    nursery: trio.Nursery, options: PatchOptions, closes: bool
) -> None:
    """tests/http/test_cancellation.py's case, with one of the two patches about the timer off: either
    alone keeps the timer armed after a response. With neither, the connection stays open."""
    cfg = ServerConfig(port=0, keep_alive_timeout=0.3, graceful_timeout=0.5, patches=options)
    shutdown = trio.Event()
    (url,) = await nursery.start(
        partial(serve, create_app(ScriptedEngine()), cfg, shutdown=shutdown, handle_signals=False)
    )
    host, port = url.removeprefix("http://").split(":")
    stream = await trio.open_tcp_stream(host, int(port))
    await stream.send_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
    got = b""
    with trio.move_on_after(2.0):  # the timeout is 0.3 s
        while data := await stream.receive_some():
            got += data
        got += b"<closed>"
    assert got.startswith(b"HTTP/1.1 200") and got.endswith(b"<closed>") is closes
    await stream.aclose()
    shutdown.set()
