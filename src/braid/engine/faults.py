"""The ``braid:fail@S`` fault hook: a prompt whose text holds it fails after ``S`` tokens.

The scripted engine always reads it; vLLM's two clients read it with ``--fault-hooks`` only
(tests of the real engine's failure paths). One pattern and one error for all three, so a test
that plants the hook sees the same failure whichever engine runs it.
"""

from __future__ import annotations

import re

from braid.errors import EngineError

_HOOK = re.compile(r"braid:fail@(\d+)")


def fault_after(text: str | None) -> int | None:
    """The ``S`` of the first ``braid:fail@S`` in ``text``, or None."""
    found = _HOOK.search(text or "")
    return int(found.group(1)) if found else None


def injected_failure(after: int) -> EngineError:
    """The engine failure the hook injects once more than ``after`` tokens were generated."""
    return EngineError(f"injected failure after {after} tokens (braid:fail@{after})")


__all__ = ["fault_after", "injected_failure"]
