"""What every benchmark section returns, and small shared measuring helpers.

Each section module (``bench/<name>.py``) has ``run(quick: bool) -> Section`` and a ``main()``
that prints the section's tables. ``bench/run.py`` runs them all in one process tree, one after
another (never two at once: they share two cores), and writes ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parent.parent
PLOTS = ROOT / "docs" / "bench"


@attrs.frozen
class Target:
    """One target of issue 6: ``met`` is computed from the measurement, never set by hand."""

    name: str
    measured: float
    target: float
    higher_is_better: bool
    unit: str = ""
    why_missed: str = ""  # filled by the section when ``met`` is False: the reason, from the data

    @property
    def met(self) -> bool:
        return self.measured >= self.target if self.higher_is_better else self.measured <= self.target

    def row(self) -> str:
        op = "≥" if self.higher_is_better else "≤"
        verdict = "met" if self.met else f"**missed**: {self.why_missed or 'see the section'}"
        return f"| {self.name} | {self.measured:.3g}{self.unit} | {op} {self.target:g}{self.unit} | {verdict} |"


@attrs.frozen
class Section:
    title: str
    markdown: str  # the section's body: tables and notes, no heading
    headlines: tuple[str, ...] = ()  # one-line results printed at the end of `make bench`
    targets: tuple[Target, ...] = ()
    plots: tuple[Path, ...] = ()  # PNG files written under docs/bench/


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table; floats get 3 significant digits."""

    def cell(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def percentile(values: Sequence[float], q: float) -> float:
    """Inclusive percentile (q in 0..100) of a non-empty sample."""
    if len(values) == 1:
        return float(values[0])
    return (
        float(statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1])
        if 1 <= q <= 99
        else (float(min(values)) if q <= 0 else float(max(values)))
    )


def _status_bytes(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} for pid {pid}")


def rss_bytes(pid: int) -> int:
    """Resident set size of one process, from /proc."""
    return _status_bytes(pid, "VmRSS")


def hwm_bytes(pid: int) -> int:
    """Peak resident set size (VmHWM) of one process since it started (or since it was reset
    by writing 5 to /proc/PID/clear_refs)."""
    return _status_bytes(pid, "VmHWM")


def reset_hwm(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


def section_main(run: Callable[[bool], Section], doc: str | None) -> None:
    """The ``main()`` of a section module: ``python -m bench.NAME [--quick]`` prints it."""
    p = argparse.ArgumentParser(description=(doc or "").splitlines()[0] if doc else None)
    p.add_argument("--quick", action="store_true", help="short runs, for a smoke test")
    section = run(p.parse_args().quick)
    print(f"## {section.title}\n\n{section.markdown}\n")
    print("| target | measured | target | verdict |\n|---|---|---|---|")
    for t in section.targets:
        print(t.row())
    print()
    for h in section.headlines:
        print(h)
    for plot in section.plots:
        print(f"plot: {plot}")
