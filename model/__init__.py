"""The formal stream model of one ``/v1/completions`` or chat request (see docs/stream-model.md).

An executable specification, independent of the server: nothing here imports braid. It works on
plain trace data (dicts, lists, tuples) recorded by a harness around the real server code.
"""

from model.machine import (
    CHOICE_TRANSITIONS,
    TRANSITIONS,
    ChoiceEvent,
    ChoiceState,
    Event,
    IllegalEvent,
    RequestMachine,
    RequestState,
)
from model.stream import (
    INVARIANTS,
    PREFIX_SAFE,
    Invariant,
    Violation,
    chat_parts,
    check_server,
    check_trace,
    echo_text,
    expected_chunks,
    parse_sse,
    reply_role,
)

__all__ = [
    "CHOICE_TRANSITIONS",
    "INVARIANTS",
    "PREFIX_SAFE",
    "TRANSITIONS",
    "ChoiceEvent",
    "ChoiceState",
    "Event",
    "IllegalEvent",
    "Invariant",
    "RequestMachine",
    "RequestState",
    "Violation",
    "chat_parts",
    "check_server",
    "check_trace",
    "echo_text",
    "expected_chunks",
    "parse_sse",
    "reply_role",
]
