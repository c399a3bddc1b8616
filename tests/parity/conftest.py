"""vLLM's own OpenAI server for the parity tier, beside the braid server the vLLM tier shares.

Both run the default tiny model with the same engine settings and seed (tools/servers.py). The
parity results are collected as the cases run and printed as one table at the end of the
session; with ``BRAID_PARITY_REPORT=path`` they are also written there as Markdown (``make
parity-report`` writes docs/parity.md).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.parity.report import RESULTS, render_markdown, render_table
from tools.servers import ROUTE_FLAGS, TOOL_FLAGS, ServerProcess, run_vllm, tiny_model_dir


@pytest.fixture(scope="session")
def vllm_reference(vllm_server: object) -> Iterator[ServerProcess]:
    # After braid's server: it builds the model (once per machine) that both then serve.
    log = Path(os.environ.get("BRAID_VLLM_REFERENCE_LOG", "/tmp/braid-parity-vllm.log"))
    # VLLM_ENABLE_RESPONSES_API_STORE: vLLM stores /v1/responses answers (in memory), so the
    # stored-responses cases (tests/parity/test_responses_parity.py) compare with braid's store.
    with run_vllm(
        *TOOL_FLAGS,
        *ROUTE_FLAGS,
        "--enable-server-load-tracking",
        model_dir=tiny_model_dir(),
        seed=0,
        log=log,
        env={"VLLM_ENABLE_RESPONSES_API_STORE": "1"},
    ) as server:
        yield server


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not RESULTS:
        return
    terminalreporter.write_sep("=", "parity with vLLM's server")
    terminalreporter.write_line(render_table())
    target = os.environ.get("BRAID_PARITY_REPORT")
    if target:
        Path(target).write_text(render_markdown())
        terminalreporter.write_line(f"parity report written to {target}")
