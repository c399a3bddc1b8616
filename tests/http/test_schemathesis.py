"""schemathesis against braid: every route of ``/openapi.json``, on real hypercorn.

The document under test is the one the server serves, and the requests go over the loopback to
braid on the scripted engine, once open and once with an API key (the key sent, and
schemathesis checking that a request without it is refused). schemathesis runs all its phases
(the document's examples, its coverage cases, then random cases, valid and invalid) with every
check but one: no 5xx; every response conforms to the document (status, content type, headers,
body: a stream event by event); a body the schema rules out is a 4xx; an undeclared method is a
405 with ``Allow``. When a server's run is over, no engine request, admission slot or queued
ticket may be left.

Left out: ``positive_data_acceptance`` (every body the schema allows is accepted). The schema
gives the body's types; values out of range, and combinations braid cannot run, are 400s naming
the field, and they are declared.

The run is bounded (``MAX_EXAMPLES`` per operation and phase, derandomized, no example database)
and the server's limits are small, so that no generated request is a long one.

Driven through schemathesis's engine from a plain sync test, not its pytest plugin: the plugin's
``from_fixture`` (the way to test a server a fixture starts) reads ``Item._nodeid``, which pytest
9.2 no longer has. The server runs its own Trio loop in a thread, so pytest-trio is not involved.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from functools import partial

import attrs
import httpx
import pytest
import schemathesis
import trio
from schemathesis.engine import Status, events, from_schema

from tests.helpers import LiveServer, start_server

MAX_EXAMPLES = 100
# With a key the routes are the same code: that run is there for the key (schemathesis sends each
# case without it too, and checks the refusal), so it needs fewer examples of each body.
MAX_EXAMPLES_WITH_KEY = 25
# Seconds per run, about three times what one takes on a quiet machine (22 s open, 14 s with the
# key, 4,400 and 3,800 cases): past it the run is stopped, and fails. (Not schemathesis's
# max-time, which is a budget that its fuzzing phase repeats until it is spent.)
MAX_TIME = 60
REQUEST_TIMEOUT = 10  # seconds: a request that takes this long is a hang
KEY = "fuzz-key"


@attrs.define
class _Run:
    """What schemathesis did: operations tested in each phase, requests sent, failures found."""

    stop_reason: str = ""
    tested: dict[str, set[str]] = attrs.Factory(dict)
    cases: int = 0
    requests: int = 0
    failures: list[str] = attrs.Factory(list)


def _fuzz(schema: schemathesis.BaseSchema) -> _Run:
    run = _Run()
    stream = from_schema(schema).execute()
    deadline = time.monotonic() + MAX_TIME
    for event in stream:
        if time.monotonic() > deadline:
            stream.stop()
        if isinstance(event, events.ScenarioFinished):
            recorder = event.recorder
            run.cases += len(recorder.cases)
            run.requests += len(recorder.interactions)
            if event.status is Status.SUCCESS:
                run.tested.setdefault(event.phase.value, set()).add(recorder.label)
            for checks in recorder.checks.values():
                for check in checks:
                    if check.status is Status.FAILURE and check.failure_info is not None:
                        failure = check.failure_info.failure
                        run.failures.append(
                            f"{recorder.label}: {check.name}: {failure.title}\n{failure.message}\n"
                            f"{check.failure_info.code_sample}"
                        )
        elif isinstance(event, events.NonFatalError | events.FatalError):
            run.failures.append(f"schemathesis error: {event!r}")
        elif isinstance(event, events.EngineFinished):
            run.stop_reason = event.stop_reason.value
            run.failures.extend(f"after the run: {f.title}\n{f.message}" for f in event.failures)
    return run


@attrs.frozen
class _ThreadedServer:
    live: LiveServer
    token: trio.lowlevel.TrioToken

    def leftovers(self) -> dict[str, float]:
        """What must be 0 once no request is in flight, read on the server's thread."""

        def read() -> dict[str, float]:
            admission = self.live.app.state.admission
            return {
                "engine unfinished requests": self.live.engine.unfinished_requests(),
                "braid_engine_requests_in_flight": self.live.gauge("braid_engine_requests_in_flight"),
                "admission slots in use": admission.in_use,
                "admission queued": admission.queued,
            }

        return trio.from_thread.run_sync(read, trio_token=self.token)


@contextmanager
def _serve_in_thread(start: Callable[[trio.Nursery], Awaitable[LiveServer]]) -> Iterator[_ThreadedServer]:
    """braid on a live server (``start``: tests.helpers.start_server with its settings) in a Trio
    loop of its own thread."""
    started: list[_ThreadedServer] = []
    ready = threading.Event()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            started.append(_ThreadedServer(await start(nursery), trio.lowlevel.current_trio_token()))
            ready.set()

    # A daemon: a server that failed to stop cannot keep pytest from exiting.
    thread = threading.Thread(target=trio.run, args=(main,), name="braid-server", daemon=True)
    thread.start()
    try:
        assert ready.wait(30), "the server did not start"
        yield started[0]
    finally:
        if started:
            trio.from_thread.run_sync(started[0].live.shutdown.set, trio_token=started[0].token)
        thread.join(30)


@pytest.mark.parametrize("keys", [False, True], ids=["open", "keys"])
def test_every_route_conforms_to_the_document(keys: bool) -> None:
    headers = {"Authorization": f"Bearer {KEY}"} if keys else {}
    # Small limits: a request the schema allows stays short (at most 16 choices).
    server_start = partial(start_server, api_keys=(KEY,) if keys else (), max_prompts=8, max_choices=16)
    with _serve_in_thread(server_start) as server:
        url = server.live.url
        document = httpx.get(url + "/openapi.json", headers=headers).raise_for_status().json()
        config = schemathesis.Config.from_dict(
            {
                "base-url": url,
                "headers": headers,
                "request-timeout": REQUEST_TIMEOUT,
                # Slow generation on a busy machine is not what this test is about.
                "suppress-health-check": ["too_slow"],
                "generation": {
                    "max-examples": MAX_EXAMPLES_WITH_KEY if keys else MAX_EXAMPLES,
                    "deterministic": True,
                    "database": "none",
                },
                "checks": {"positive_data_acceptance": {"enabled": False}},
            }
        )
        # Loaded from the document rather than its URL: schemathesis leaves out the operation
        # that served the document it loaded, and /openapi.json is tested like every route.
        schema = schemathesis.openapi.from_dict(document, config=config)
        start = time.monotonic()
        run = _fuzz(schema)
        elapsed = time.monotonic() - start
        if run.failures:
            pytest.fail(f"{len(run.failures)} failures:\n\n" + "\n\n".join(run.failures), pytrace=False)
        assert run.stop_reason == "completed", f"the run stopped early ({run.stop_reason}) after {elapsed:.1f} s"
        operations = {f"{method.upper()} {path}" for path, item in document["paths"].items() for method in item}
        assert run.tested == dict.fromkeys(("examples", "coverage", "fuzzing"), operations) | {
            # the operations with examples
            "examples": {
                "POST /v1/completions",
                "POST /v1/chat/completions",
                "POST /v1/chat/completions/batch",
                "POST /tokenize",
                "POST /detokenize",
                "POST /invocations",
                "POST /v1/messages",
                "POST /v1/messages/count_tokens",
                "POST /v1/responses",
            }
        }
        assert server.live.engine.finished_total > 0, "no request reached the engine"
        # The client has every answer; a run may still be closing on the server's side.
        deadline = time.monotonic() + 5
        while any(server.leftovers().values()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.leftovers() == dict.fromkeys(server.leftovers(), 0)
        print(f"schemathesis: {run.cases} cases, {run.requests} requests in {elapsed:.1f} s")
