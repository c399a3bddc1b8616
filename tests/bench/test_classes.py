"""bench.classes: one window of its load and probe against ``braid serve`` on the scripted engine."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from bench import classes
from braid.engine.scripted import VOCAB_SIZE
from tools.servers import free_port, stop, wait_healthy


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    port = free_port()
    log = tmp_path_factory.mktemp("classes") / "braid.log"
    argv = [sys.executable, "-m", "braid", "serve", "--engine", "scripted", "--port", str(port)]
    # A round of the load (4 requests of 64 prompts x 32 tokens on 8 slots) takes 32 x 32 token
    # delays, 0.5 s here: a window several times that sees requests end however slow the machine.
    argv += ["--token-delay", "0.0005", "--max-in-flight-requests", "8"]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy("braid", proc, url, log, 60)
            yield SimpleNamespace(kind="braid", url=url, model="scripted")
        finally:
            stop(proc)


@pytest.mark.parametrize("background", [True, False])
def test_a_window_probes_beside_the_load(scripted: SimpleNamespace, background: bool) -> None:
    """The load keeps the 8 slots busy, the probe gets through, and the load's rate counts whole
    requests (about 4 s)."""
    out = classes.window(scripted, background, seconds=2.0, seed=1, vocab=VOCAB_SIZE)
    assert len(out["probes"]) >= 2 and all(p > 0 for p in out["probes"])
    assert out["idle"] > 0
    assert out["done"] > 0 and out["done"] % classes.PROMPTS == 0
    assert out["rate"] > 0


def test_a_refused_load_fails_the_window(scripted: SimpleNamespace) -> None:
    """A load the server refuses is an error, not a fast window: token ids past the scripted
    engine's vocabulary are a 400 (the probe, a text prompt, still gets through)."""
    with pytest.raises(RuntimeError, match=r"load requests failed with \[400\]"):
        classes.window(scripted, True, seconds=0.5, seed=1, vocab=4 * VOCAB_SIZE)
