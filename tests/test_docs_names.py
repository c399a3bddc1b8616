"""Every braid module, class or function that the docs and docstrings name exists.

Names are read where the text marks them as code: between backticks in Markdown, and in
docstrings' ``double backticks`` and roles (:mod:`braid.x`, :class:`~braid.x.Y`); and every
``src/braid/...py`` path. The dated records are left out: docs/performance-log.md (each round
names the modules as they were then) and docs/benchmarks.md (written by ``make bench``).
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from braid.logs import ACCESS_LOGGER

ROOT = Path(__file__).resolve().parents[1]
DATED = {"performance-log.md", "benchmarks.md"}
SOURCES = sorted(
    [p for p in (ROOT / "docs").glob("*.md") if p.name not in DATED]
    + [ROOT / "README.md"]
    + list((ROOT / "src" / "braid").rglob("*.py"))
)
LOGGERS = {"braid", ACCESS_LOGGER} | {
    m.group(1)
    for p in (ROOT / "src" / "braid").rglob("*.py")
    for m in re.finditer(r'getLogger\("([\w.]+)"\)', p.read_text())
}
"""Logger names (``braid.access``, ``braid.engine``...) are names too, though not always modules."""
_CODE = re.compile(r"`~?(braid(?:\.[A-Za-z_]\w*)+)(?:\(\))?`")
_PATH = re.compile(r"(?<![\w/.-])(src/braid/[\w/]+\.py)")


def resolves(name: str) -> bool:
    """``name`` is a logger's, a module, or an attribute path from the longest module prefix of it."""
    if name in LOGGERS:
        return True
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            if not hasattr(obj, part):
                return False
            obj = getattr(obj, part)
        return True
    return False


def names_in(text: str) -> tuple[set[str], set[str]]:
    return {m.group(1) for m in _CODE.finditer(text)}, {m.group(1) for m in _PATH.finditer(text)}


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_name_the_text_gives_exists(source: Path) -> None:
    dotted, paths = names_in(source.read_text())
    missing = sorted(n for n in dotted if not resolves(n)) + sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"{source.relative_to(ROOT)} names what does not exist: {missing}"


def test_a_stale_name_is_found() -> None:
    dotted, paths = names_in("the merger (`braid.stream.merge.ChatStreamMerger`) in `src/braid/admit.py`")
    assert dotted == {"braid.stream.merge.ChatStreamMerger"} and not resolves("braid.stream.merge.ChatStreamMerger")
    assert paths == {"src/braid/admit.py"} and not (ROOT / "src/braid/admit.py").exists()
    assert resolves("braid.stream.merge.StreamMerger") and resolves("braid.engine.vllm_common")
