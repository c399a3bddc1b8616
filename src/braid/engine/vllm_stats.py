"""vLLM's engine statistics under vLLM's names: every vLLM-version-sensitive call of braid's metrics.

braid's Trio client (:mod:`.vllm_core`) turns ``log_stats`` on for the engine core and the
output processor, as ``AsyncLLM`` does, and feeds what they compute to vLLM's own
``PrometheusStatLogger``, the way ``AsyncLLM``'s output handler does: per message from the engine
core, one ``IterationStats`` filled by the output processor, then ``record`` with the message's
``SchedulerStats``. So the ``vllm:*`` families are vLLM's own: the same names, types, help texts,
label sets (``model_name``, ``engine``, plus ``finished_reason`` and the like) and buckets as
``vllm serve`` shows.

vLLM's logger writes into prometheus_client's global registry (as it does in ``vllm serve``);
braid's ``/metrics`` renders the app's own registry, so :func:`braid.metrics.Metrics.track_engine`
forwards the ``vllm:*`` families of the global one at scrape time, adding braid's admission queue
to the waiting gauges (see there). The asyncio client's ``AsyncLLM`` feeds the same logger itself.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import Any

from braid.metrics import EngineFamilies

PREFIX = "vllm:"
"""The families forwarded from the engine's registry."""

WAITING = "vllm:num_requests_waiting"
"""vLLM's waiting gauge: braid adds its own queued requests to it."""

WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"
"""vLLM's waiting gauge by ``reason``, whose sum is :data:`WAITING`: braid's queued requests count
under :data:`CAPACITY_REASON` (they wait for engine slots)."""

CAPACITY_REASON = "capacity"


def engine_families() -> EngineFamilies:
    """vLLM's families, in the registry vLLM's Prometheus stat logger writes into
    (prometheus_client's global one), for :meth:`braid.metrics.Metrics.track_engine`."""
    from vllm.v1.metrics.prometheus import get_prometheus_registry

    return EngineFamilies(get_prometheus_registry(), PREFIX, WAITING, WAITING_BY_REASON, CAPACITY_REASON)


def observe_all(child: Any, values: Sequence[float]) -> None:
    """``child.observe(v)`` for every ``v`` of ``values``, into a labelled prometheus_client
    ``Histogram``: each value counted in the first bucket whose upper bound is at least the value,
    as ``observe`` counts it, and their sum added to the histogram's. One increment per bucket hit
    and one of the sum, where ``observe`` makes five calls and a scan of the bounds per value; the
    sum may differ from ``observe``'s by float rounding (one addition of the values' sum instead
    of one per value)."""
    bounds = child._upper_bounds
    hits = [0] * len(bounds)
    for v in values:
        hits[bisect_left(bounds, v)] += 1
    buckets = child._buckets
    for i, n in enumerate(hits):
        if n:
            buckets[i].inc(n)
    child._sum.inc(sum(values))


class VllmStats:
    """vLLM's ``PrometheusStatLogger`` for one engine (index 0), fed as ``AsyncLLM`` feeds it.

    Made in the thread that starts the engine (:func:`.vllm_core.open_core_engine`); used on the
    Trio thread only: :meth:`iteration` before an engine-core message's outputs are processed,
    :meth:`record` after.
    """

    __slots__ = ("_iteration_cls", "_itl", "_logger")

    def __init__(self, vllm_config: Any) -> None:
        from vllm.v1.metrics.loggers import PrometheusStatLogger
        from vllm.v1.metrics.stats import IterationStats

        self._iteration_cls = IterationStats
        # Unregisters the vllm:* collectors of an earlier logger in this process, then registers.
        self._logger = PrometheusStatLogger(vllm_config, [0])
        self._logger.log_engine_initialized()  # vllm:cache_config_info
        self._itl = self._logger.histogram_inter_token_latency[0]

    def iteration(self) -> Any:
        """A new ``IterationStats``, for the output processor to fill with one message's outputs."""
        return self._iteration_cls()

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        """One engine-core message's statistics (either may be None), into vLLM's families.

        The message's inter-token latencies, one per token of every running request, are
        counted into ``vllm:inter_token_latency_seconds`` here in one pass (:func:`observe_all`),
        and taken out of ``iteration_stats`` so that vLLM's logger, which observes them one by
        one, finds none: the same histogram at a fifth of the calls per token (docs/performance-log.md,
        round 13)."""
        itls = None if iteration_stats is None else iteration_stats.inter_token_latencies_iter
        if itls:
            observe_all(self._itl, itls)
            iteration_stats.inter_token_latencies_iter = []
        self._logger.record(scheduler_stats=scheduler_stats, iteration_stats=iteration_stats, engine_idx=0)


__all__ = ["CAPACITY_REASON", "PREFIX", "WAITING", "WAITING_BY_REASON", "VllmStats", "engine_families", "observe_all"]
