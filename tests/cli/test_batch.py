"""``braid batch``: a file run offline on the scripted engine, in a subprocess as users run it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from braid.cli.batch import first_url


def _run(tmp_path: Path, lines: list[Any], *flags: str) -> tuple[int, list[dict[str, Any]], str]:
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    argv = [sys.executable, "-m", "braid", "batch", "-i", str(source), "-o", str(out), "--engine", "scripted", *flags]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    rows = [json.loads(r) for r in out.read_text().splitlines()] if out.exists() else []
    return done.returncode, rows, done.stderr


def _line(cid: str, body: dict[str, Any], url: str = "/v1/completions") -> dict[str, Any]:
    return {"custom_id": cid, "method": "POST", "url": url, "body": body}


def test_every_line_gets_one_row_in_input_order(tmp_path: Path) -> None:
    lines: list[Any] = [_line(f"c{i}", {"prompt": ["a", "b"] if i % 2 else "x", "max_tokens": 3}) for i in range(12)]
    lines.insert(3, _line("bad", {"prompt": "x", "max_tokens": -1}))
    lines.append("not json")
    code, rows, err = _run(tmp_path, lines)
    assert code == 0, err
    assert [r["line"] for r in rows] == list(range(1, 15))
    assert [r["custom_id"] for r in rows] == [line["custom_id"] for line in lines[:-1]] + [None]
    answered = [r for r in rows if r["response"] and r["response"]["status_code"] == 200]
    assert len(answered) == 12 and [r["custom_id"] for r in answered] == [f"c{i}" for i in range(12)]
    assert all(len(r["response"]["body"]["choices"]) == (2 if int(r["custom_id"][1:]) % 2 else 1) for r in answered)
    assert rows[3]["response"]["status_code"] == 400 and rows[3]["response"]["body"]["error"]["param"] == "max_tokens"
    assert rows[-1]["error"]["code"] == "invalid_json"
    assert "completed: 12 of 14 lines answered, 2 failed" in err


def test_chat_lines_and_the_endpoint_from_the_first_line(tmp_path: Path) -> None:
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    lines = [
        _line("a", chat, "/v1/chat/completions"),
        _line("b", {"prompt": "x"}),
        _line("c", chat, "/v1/chat/completions"),
    ]
    code, rows, err = _run(tmp_path, lines)
    assert code == 0, err
    assert [r["response"]["body"]["object"] if r["error"] is None else r["error"]["code"] for r in rows] == [
        "chat.completion",
        "invalid_url",
        "chat.completion",
    ]


def test_a_file_with_nothing_runnable_fails_with_every_error_written(tmp_path: Path) -> None:
    code, rows, err = _run(tmp_path, ["{", _line("x", {"prompt": "p", "n": 0})])
    assert code == 1, err
    assert [r["line"] for r in rows] == [1, 2] and all(r["response"] is None or r["error"] is None for r in rows)


@pytest.mark.parametrize(
    ("flags", "message"),
    [(("--endpoint", "/v1/embeddings"), "invalid choice"), (("--no-such-flag",), "unrecognized arguments")],
)
def test_usage_errors_exit_2(tmp_path: Path, flags: tuple[str, ...], message: str) -> None:
    code, _, err = _run(tmp_path, [_line("a", {"prompt": "x"})], *flags)
    assert code == 2 and message in err


def test_a_missing_input_file_is_one_line_and_status_1(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    argv = [sys.executable, "-m", "braid", "batch", "-i", str(tmp_path / "none.jsonl"), "-o", str(out)]
    done = subprocess.run([*argv, "--engine", "scripted"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stderr.strip() == f"braid: no such input file: {tmp_path / 'none.jsonl'}"
    assert not out.exists()


def test_first_url_skips_lines_without_one(tmp_path: Path) -> None:
    f = tmp_path / "f.jsonl"
    f.write_text('not json\n{"custom_id": "a"}\n[1]\n{"url": "/v1/chat/completions"}\n')
    assert first_url(f) == "/v1/chat/completions"
    f.write_text("{}\n")
    assert first_url(f) is None
