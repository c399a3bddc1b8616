"""The runner's resume point: the rows already written, a torn last row cut off."""

from __future__ import annotations

from pathlib import Path

from braid.batch.runner import read_done
from braid.batch.validate import answer_row, error_row


def test_read_done_counts_whole_rows_and_cuts_a_torn_one(tmp_path: Path) -> None:
    rows = answer_row(1, "a", 200, b"{}") + error_row(3, None, "invalid_json", "x") + answer_row(4, "a", 400, b"{}")
    path = tmp_path / "out.jsonl"
    path.write_bytes(rows + answer_row(7, "z", 200, b"{}")[:20])
    assert read_done(path) == ({1, 3, 4}, 3)
    assert path.read_bytes() == rows  # the torn row is gone, so the next append starts a line
    assert read_done(tmp_path / "none.jsonl") == (set(), 0)
