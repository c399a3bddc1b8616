"""Shared fixtures: braid on real hypercorn (loopback, port 0) inside the test's own trio run,
and (session-wide) one real ``braid serve --engine vllm`` for the vLLM and parity tiers."""

from __future__ import annotations

import os
import signal
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import trio

from tests.helpers import LiveServer, VllmServer, start_server
from tools.postgres import Postgres, run_postgres
from tools.router import Replicas, run_replicas
from tools.servers import ROUTE_FLAGS, TOOL_FLAGS, ServerProcess, run_braid

LORA_ADAPTER = "tiny-lora"
"""The name braid's test adapter (braid.models.lora) is served under by :func:`lora_server`."""
LORA_FLAGS = ("--enable-lora", "--max-loras", "2", "--max-lora-rank", "8")
"""The LoRA engine settings of braid's LoRA server and of vLLM's in the parity tier."""


@pytest.fixture
async def server(nursery: trio.Nursery) -> AsyncIterator[LiveServer]:
    srv = await start_server(nursery, token_delay=0.001)
    yield srv
    srv.shutdown.set()


@pytest.fixture
async def client(server: LiveServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        yield c


@pytest.fixture(scope="session")
def vllm_server() -> Iterator[VllmServer]:
    """One braid on vLLM for the whole session. No --model: the default tiny model is built
    (once per machine, cached) and served, as ``make serve`` does."""
    log = Path(os.environ.get("BRAID_VLLM_LOG", "/tmp/braid-vllm-tier.log"))
    # --enable-server-load-tracking as on vLLM's parity server (tests/parity/test_load_parity.py)
    # ROUTE_FLAGS as on vLLM's parity server: GET /tokenizer_info and X-Request-Id on every answer
    with run_braid(
        "--fault-hooks", "--enable-server-load-tracking", *TOOL_FLAGS, *ROUTE_FLAGS, seed=0, log=log
    ) as server:
        yield VllmServer(server)
        # a clean drain on SIGTERM is part of what the tier checks
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(60) == 0


@pytest.fixture(scope="session")
def lora_adapter() -> Path:
    from braid.models import lora

    return lora.default_adapter()


@pytest.fixture(scope="session")
def lora_server(lora_adapter: Path) -> Iterator[ServerProcess]:
    """A second braid on vLLM, with LoRA on and runtime loading allowed, for the LoRA tests of the
    vLLM and parity tiers (tests/vllm/test_lora.py says why the shared server has no LoRA)."""
    log = Path(os.environ.get("BRAID_LORA_LOG", "/tmp/braid-lora-tier.log"))
    flags = (*LORA_FLAGS, "--allow-runtime-lora-updating", "--lora-modules", f"{LORA_ADAPTER}={lora_adapter}")
    with run_braid(*flags, seed=0, log=log) as server:
        yield server


# Every `braid serve` a test starts (they inherit the environment) keeps its store in a directory
# of this session's, never in the user's data directory.
_STORE_DIR = tempfile.mkdtemp(prefix="braid-test-store-")
os.environ.setdefault("BRAID_STORAGE_DIR", _STORE_DIR)


@pytest.fixture(scope="session")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    """Three braid replicas on vLLM behind no router yet, for the router's tests
    (tests/deploy/test_router.py) and bench/replicas.py's (tests/bench/test_replicas.py): the pair
    the policies are shown on, publishing their KV-cache events, and a third that the drain test
    stops. Each reports its load (``--enable-server-load-tracking``, for ``power_of_two``)."""
    logs = tmp_path_factory.mktemp("fleet")
    with run_replicas(3, logs, "--enable-server-load-tracking", "--graceful-timeout", "5", publishers=2) as replicas:
        yield replicas


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    """A real PostgreSQL (Debian's package, installed when missing: tools/postgres.py), one
    throwaway cluster for the session; each test makes its own database in it."""
    with run_postgres() as pg:
        yield pg
