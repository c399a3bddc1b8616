"""bench.chat_tools without servers: its runs' flags, and the order of the alternating runs."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench.chat_tools import KINDS, TOOL_BODY, chat_argv
from bench.serving import alternating_runs


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_every_run_is_a_streamed_chat_and_only_the_tools_runs_carry_tools() -> None:
    servers = {kind: SimpleNamespace(url=f"http://127.0.0.1:{8000 + i}") for i, kind in enumerate(KINDS)}
    argv = chat_argv(servers, Path("/model"), "chat-tools")
    for kind in KINDS:
        a = argv(kind, 64, 256, f"{kind}-c64-r0")
        assert _flag(a, "--backend") == "openai-chat"
        assert _flag(a, "--endpoint") == "/v1/chat/completions"
        assert _flag(a, "--base-url") == servers[kind].url
        assert "/" not in (_flag(a, "--result-filename") or "")
        body = _flag(a, "--extra-body")
        if kind.endswith("/tools"):
            assert body is not None and json.loads(body) == TOOL_BODY
            assert TOOL_BODY["tool_choice"] == "auto"
        else:
            assert body is None


class _Worker:
    """Stands in for ``bench.vllm_tools.Worker("bench")``: records the runs, all of them whole."""

    def __init__(self) -> None:
        self.proc = SimpleNamespace(pid=os.getpid())
        self.calls: list[str] = []

    def call(self, **command: Any) -> dict[str, Any]:
        argv = command["argv"]
        self.calls.append(argv[0])
        return {"failed": 0, "completed": argv[1]}


def _order(kinds: tuple[str, ...] | None) -> list[str]:
    worker = _Worker()
    names = kinds or ("braid", "vllm")
    servers = {k: SimpleNamespace(pid=os.getpid()) for k in names}
    pids = dict.fromkeys(names, os.getpid())

    def argv(kind: str, c: int, n: int, tag: str) -> list[Any]:
        return [f"{kind}@{c}", n]

    extra = {} if kinds is None else {"kinds": kinds}
    alternating_runs(worker, servers, pids, argv, (1, 64), {1: 2, 64: 3}, 2, **extra)  # type: ignore[arg-type]
    return worker.calls


def test_the_serving_sections_order_is_unchanged() -> None:
    assert _order(None) == [
        *("braid@1", "vllm@1", "braid@64", "vllm@64"),
        *("vllm@1", "braid@1", "vllm@64", "braid@64"),
    ]


def test_several_kinds_go_forward_then_backward() -> None:
    assert _order(("a", "b", "c")) == [
        *("a@1", "b@1", "c@1", "a@64", "b@64", "c@64"),
        *("c@1", "b@1", "a@1", "c@64", "b@64", "a@64"),
    ]
