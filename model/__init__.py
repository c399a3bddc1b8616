"""The formal stream model of one ``/v1/completions`` request (see docs/stream-model.md).

An executable specification, independent of the server: nothing here imports braid. It works on
plain trace data (dicts, lists, tuples) recorded by a harness around the real server code.
"""

from model.stream import (
    INVARIANTS,
    ChoiceState,
    Invariant,
    RequestMachine,
    RequestState,
    Violation,
    check_server,
    check_trace,
    expected_chunks,
    parse_sse,
)

__all__ = [
    "INVARIANTS",
    "ChoiceState",
    "Invariant",
    "RequestMachine",
    "RequestState",
    "Violation",
    "check_server",
    "check_trace",
    "expected_chunks",
    "parse_sse",
]
