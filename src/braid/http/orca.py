"""The ORCA load report: the ``endpoint-load-metrics`` response header, as vLLM 0.32 builds it.

A request to ``/v1/completions`` or ``/v1/chat/completions`` (or ``/invocations``, which answers
as one of them) with the header ``endpoint-load-metrics-format: text`` or ``json`` (any case)
gets, on a whole (non-streamed) 200 answer, a header naming the server's load (for a load
balancer such as Envoy's ORCA-aware one):

* ``text``: ``endpoint-load-metrics: TEXT named_metrics.num_requests_waiting=0.0, named_metrics.kv_cache_usage_perc=0.0``
* ``json``: ``endpoint-load-metrics: JSON {"named_metrics": {"num_requests_waiting": 0.0, "kv_cache_usage_perc": 0.0}}``

Any other format, an empty one, a stream, or an error answer: no header (vLLM logs a warning
for a format it does not know; braid says nothing). The figures are
:meth:`braid.metrics.Metrics.load_report`'s, read when the answer is ready; ``num_requests_waiting``
counts braid's admission queue too (docs/compatibility.md says exactly what).
"""

from __future__ import annotations

import json

from braid.metrics import Metrics

FORMAT_HEADER = "endpoint-load-metrics-format"
"""The request header asking for a report, and naming its format."""
HEADER = "endpoint-load-metrics"
"""The response header carrying it."""


def load_header(metrics_format: str | None, metrics: Metrics) -> tuple[tuple[str, str], ...]:
    """The report header for a request's ``endpoint-load-metrics-format`` value, or none."""
    kind = (metrics_format or "").lower()
    if kind not in ("text", "json"):
        return ()
    figures = metrics.load_report()
    if kind == "text":
        return ((HEADER, "TEXT " + ", ".join(f"named_metrics.{name}={value}" for name, value in figures)),)
    return ((HEADER, "JSON " + json.dumps({"named_metrics": dict(figures)})),)


__all__ = ["FORMAT_HEADER", "HEADER", "load_header"]
