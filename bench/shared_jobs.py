"""Batch jobs on PostgreSQL, one braid alone against replicas sharing jobs (``--store-shared``).

Four braids on the real engine (tiny model) and one throwaway PostgreSQL (tools/postgres.py),
all up at once: one on a database of its own without ``--store-shared`` (rows in its work
files), one alone on a database of its own with it (rows in the database, chunks claimed with
leases), and two sharing a third database. Each system runs the same completions job (32 token
ids in, 32 out, ``ignore_eos``), made on its first braid, in alternating rounds after a warm-up;
every row is checked (bench.batch_jobs.timed_job). The wall is the job's, create to completed.

The first two rows are the cost of sharing on one replica. The third is informative only: on
this 2-core machine the two replicas' engines share the cores one engine has alone, so it shows
what the sharing costs in contention, not the gain of a second device.
"""

from __future__ import annotations

import statistics
from contextlib import ExitStack
from pathlib import Path

import httpx

from bench.batch_jobs import PROMPT_LEN, SEED, VOCAB, completion_lines, timed_job
from bench.common import Section, section_main, table
from bench.vllm_tools import WORK, random_token_prompts
from tools.servers import ServerProcess

SYSTEMS = ("one braid", "one braid, --store-shared", "two braids, --store-shared")


def measure(lines: int, rounds: int, logs: Path = WORK / "shared-jobs") -> dict[str, list[float]]:
    """Output tok/s of each system, a value per round."""
    from tools.postgres import run_postgres
    from tools.servers import run_braid, tiny_model_dir

    logs.mkdir(parents=True, exist_ok=True)
    prompts = random_token_prompts(lines, PROMPT_LEN, VOCAB, SEED)
    with ExitStack() as stack:
        postgres = stack.enter_context(run_postgres())

        def braid(name: str, database: str, *flags: str) -> ServerProcess:
            storage = logs / name
            return stack.enter_context(
                run_braid(
                    "--storage-dir",
                    str(storage),
                    "--store",
                    database,
                    *flags,
                    model_dir=tiny_model_dir(),
                    log=logs / f"{name}.log",
                )
            )

        shared = postgres.create_database()
        first = {
            SYSTEMS[0]: braid("alone", postgres.create_database()),
            SYSTEMS[1]: braid("shared-1", postgres.create_database(), "--store-shared"),
            SYSTEMS[2]: braid("shared-2a", shared, "--store-shared"),
        }
        braid("shared-2b", shared, "--store-shared")
        client = stack.enter_context(httpx.Client(timeout=600))
        model = first[SYSTEMS[0]].model
        data = completion_lines(prompts, model)
        warm = max(200, lines // 15)
        for server in first.values():
            timed_job(client, server, completion_lines(prompts[:warm], model), "/v1/completions", warm)
        rates: dict[str, list[float]] = {s: [] for s in SYSTEMS}
        for r in range(rounds):
            for name in SYSTEMS[r % 3 :] + SYSTEMS[: r % 3]:
                done = timed_job(client, first[name], data, "/v1/completions", lines)
                rates[name].append(done["tokens"] / done["wall"])
    return rates


def run(quick: bool) -> Section:
    lines, rounds = (600, 1) if quick else (3000, 3)
    rates = measure(lines, rounds)
    base = statistics.median(rates[SYSTEMS[0]])
    rows = [
        [name, statistics.median(v), f"{min(v):,.0f}–{max(v):,.0f}", statistics.median(v) / base]
        for name, v in rates.items()
    ]
    markdown = (
        f"A {lines:,}-line completions job, {rounds} alternating rounds; output tok/s.\n\n"
        + table(["system", "output tok/s (median)", "range", "× one braid"], rows)
        + "\n\nOn 2 cores the two replicas share one engine's cores: the last row is not a scaling figure."
    )
    headline = f"shared jobs: one braid with --store-shared at {rows[1][3]:.2f}× one braid without"
    return Section("Batch jobs shared by replicas (--store-shared)", markdown, headlines=(headline,))


def main() -> None:
    section_main(run, __doc__)


if __name__ == "__main__":
    main()
