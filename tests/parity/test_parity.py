"""The differential matrix: every case must match vLLM's server or be a documented deviation."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.parity.client import send
from tests.parity.compare import diff, view
from tests.parity.deviations import DEVIATIONS
from tests.parity.matrix import MATRIX, Case
from tests.parity.messages_matrix import MESSAGES_MATRIX
from tests.parity.report import RESULTS, Result
from tests.parity.responses_cases import RESPONSES_CASES
from tools.servers import ServerProcess

pytestmark = pytest.mark.vllm

DOCS = Path(__file__).resolve().parents[2] / "docs" / "compatibility.md"


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=300) as c:
        yield c


@pytest.mark.parametrize("case", MATRIX, ids=[c.name for c in MATRIX])
def test_case(case: Case, vllm_server: object, vllm_reference: ServerProcess, http: httpx.Client) -> None:
    braid = send(http, vllm_server.url, case)  # type: ignore[attr-defined]
    vllm = send(http, vllm_reference.url, case)
    if case.deviation is None:
        problems = diff(view(braid), view(vllm))
        outcome = "match" if not problems else "mismatch"
    else:
        problems = DEVIATIONS[case.deviation].check(braid, vllm, case.body)
        outcome = "deviation" if not problems else "mismatch"
    detail = case.deviation or ""
    if problems:
        detail = "; ".join(problems[:3])
    RESULTS.append(Result(case.name, case.group, outcome, detail))
    assert not problems, "\n".join(problems[:20])


def test_matrix_is_large_and_names_are_unique() -> None:
    assert len(MATRIX) >= 60
    assert len({c.name for c in MATRIX}) == len(MATRIX)


def test_every_deviation_is_documented_and_used() -> None:
    text = DOCS.read_text()
    documented = set(re.findall(r"`deviation:([a-z_]+)`", text))
    used = {c.deviation for c in (*MATRIX, *MESSAGES_MATRIX, *RESPONSES_CASES) if c.deviation}
    assert used <= set(DEVIATIONS)
    assert set(DEVIATIONS) == documented, "docs/compatibility.md must name every deviation as `deviation:<key>`"
    assert used == set(DEVIATIONS), "every deviation must be exercised by at least one case"
