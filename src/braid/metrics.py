"""Prometheus metrics, one registry per app (so tests and several apps in a process do not mix).

The latency histograms (time to first token, inter-token latency, end-to-end latency) are
observed per engine request, on Trio's clock, from the moment the HTTP request arrived (the view
is entered: admission's queue wait, the body read and tokenizing are included). Their exact
definitions are in :class:`Metrics`' attribute docstrings and in the help texts, which say the
same. They are :class:`PlainHistogram`\\ s, not prometheus_client's ``Histogram``: the
inter-token latency is observed for every output of every stream, and prometheus_client's
``observe`` takes a lock and walks the buckets each time (docs/performance-log.md, round 9).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from itertools import accumulate
from typing import Literal, Protocol, get_args

import attrs
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

# The *_created series double the output and no dashboard of ours reads them.
disable_created_metrics()


class _Delta(Protocol):
    """What :meth:`TokenTimer.seen` reads of an engine's choice delta
    (:class:`braid.engine.base.ChoiceDelta`): metrics sit below the engines."""

    @property
    def index(self) -> int: ...

    @property
    def token_ids(self) -> Sequence[int]: ...


AbortCause = Literal["disconnect", "error", "stall", "timeout", "drain", "queue"]
"""Why braid aborted an engine request (the ``cause`` label of ``braid_engine_aborts_total``):

* ``disconnect``: the run was cancelled from outside while the server was not draining: the
  client went away (a write cut off by ``--write-timeout`` closes the connection, so it counts
  here too).
* ``error``: the request failed: another engine request of its batch failed in the engine (the
  failed one itself is ``braid_engine_errors_total``, not an abort), or braid's own code raised.
* ``stall``: the client read nothing for ``--stall-timeout``.
* ``timeout``: ``--request-timeout`` passed.
* ``drain``: the run was cancelled from outside while the server was draining (at the end of the
  graceful period; a client that leaves during a drain cannot be told apart and counts here).
* ``queue``: a prompt that never reached the engine: its request ended, for any of the causes
  above, while the prompt waited for its admission slots (or for its turn to start). Requests
  refused by a full queue (429) never became runs; they are ``braid_admission_rejected_total``.

Once the server is idle, every prompt of every request that reached a run
(``braid_request_prompts_sum``) is exactly one of: finished
(``braid_e2e_request_latency_seconds_count``), failed in the engine
(``braid_engine_errors_total``), or aborted (``braid_engine_aborts_total``, summed over causes).
"""

ABORT_CAUSES: tuple[AbortCause, ...] = get_args(AbortCause)

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
"""vLLM's ``vllm:time_to_first_token_seconds`` buckets."""

ITL_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
"""vLLM's ``vllm:inter_token_latency_seconds`` buckets, and three below its first (10 ms): a small
model decodes faster than that, and a fast token is the one a front end can slow down."""

E2E_BUCKETS = (
    0.025, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
"""vLLM's ``vllm:e2e_request_latency_seconds`` buckets, and three below its first (0.3 s)."""


class PlainHistogram:
    """A Prometheus histogram kept in a list of ints and a float, registered as a collector.

    An observation is a bisection and two additions, with no lock: every observation is made on
    the Trio thread, and so is every scrape of braid's ``/metrics`` route, so a scrape sees each
    observation whole. (A scrape from another thread would see a copy that may be one
    observation behind between its buckets and its sum.) The hot path may write :attr:`counts`
    and :attr:`sum` itself, as :meth:`TokenTimer.seen` does, by the same rule as
    :meth:`observe`.
    """

    __slots__ = ("_les", "bounds", "counts", "documentation", "name", "sum")

    def __init__(self, name: str, documentation: str, buckets: Sequence[float], registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds: tuple[float, ...] = tuple(sorted(float(b) for b in buckets))
        """The buckets' upper bounds (inclusive: a value equal to a bound is in its bucket)."""
        self.counts: list[int] = [0] * (len(self.bounds) + 1)
        """Observations per bucket, not cumulative; the last is the ``+Inf`` bucket's own."""
        self.sum = 0.0
        self._les = [*(floatToGoString(b) for b in self.bounds), "+Inf"]
        registry.register(self)

    def observe(self, value: float, times: int = 1) -> None:
        """``times`` observations of ``value``."""
        self.counts[bisect_left(self.bounds, value)] += times
        self.sum += value * times

    def describe(self) -> Iterable[HistogramMetricFamily]:
        return [HistogramMetricFamily(self.name, self.documentation)]

    def collect(self) -> Iterable[HistogramMetricFamily]:
        counts, total = list(self.counts), self.sum
        buckets = list(zip(self._les, accumulate(counts), strict=True))
        return [HistogramMetricFamily(self.name, self.documentation, buckets=buckets, sum_value=total)]


@attrs.frozen
class EngineFamilies:
    """An engine's own metric families, kept by its own stat logger in ``registry`` (vLLM's:
    :mod:`braid.engine.vllm_stats`), and what braid adds to them (:meth:`Metrics.track_engine`)."""

    registry: CollectorRegistry
    prefix: str
    """The families forwarded: those whose name starts with this (``vllm:``)."""
    waiting: str
    """The engine's gauge of waiting requests: braid adds its queued requests to each sample."""
    waiting_by_reason: str | None = None
    """The same by a ``reason`` label: braid's queued requests are added under ``reason``."""
    reason: str = "capacity"


ORCA_NAMES = {"vllm:num_requests_waiting": "num_requests_waiting", "vllm:kv_cache_usage_perc": "kv_cache_usage_perc"}
"""vLLM's gauges an ORCA load report carries, under the names vLLM gives them there."""


class ForwardedFamilies:
    """A collector: the families of :class:`EngineFamilies`, read from their registry at scrape
    time, with ``queued()`` added to the waiting gauges (see :meth:`Metrics.track_engine`)."""

    def __init__(self, families: EngineFamilies, queued: Callable[[], float]) -> None:
        self.families = families
        self.queued = queued

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        f = self.families
        for family in f.registry.collect():
            if not family.name.startswith(f.prefix):
                continue
            if family.name == f.waiting or family.name == f.waiting_by_reason:
                queued = self.queued()
                by_reason = family.name == f.waiting_by_reason
                family.samples = [
                    s._replace(value=s.value + queued) if not by_reason or s.labels.get("reason") == f.reason else s
                    for s in family.samples
                ]
            yield family


@attrs.define(eq=False)
class Metrics:
    registry: CollectorRegistry = attrs.field(factory=CollectorRegistry)
    in_flight: Gauge = attrs.field(init=False)
    aborts: Counter = attrs.field(init=False)
    """``braid_engine_aborts_total{cause}``: see :data:`AbortCause`; count through :meth:`abort`."""
    engine_requests: Counter = attrs.field(init=False)
    engine_errors: Counter = attrs.field(init=False)
    rejected: Counter = attrs.field(init=False)
    http_responses: Counter = attrs.field(init=False)
    queue_wait: Histogram = attrs.field(init=False)
    prompts: Histogram = attrs.field(init=False)
    time_to_first_token: PlainHistogram = attrs.field(init=False)
    """``braid_time_to_first_token_seconds``: per streamed engine request that got a token,
    however it ended, from the HTTP request's arrival to braid's receipt of the request's first
    output that carries a token. A non-streaming request's engine requests deliver their whole
    completion in one output (vLLM's ``FINAL_ONLY``), so they have no first token to time and are
    not observed; nor is a request that ended before its first token."""
    inter_token_latency: PlainHistogram = attrs.field(init=False)
    """``braid_inter_token_latency_seconds``: per token of a streamed engine request, except the
    tokens of each choice's first output (those are the first token's, timed above): the time
    from the previous output carrying tokens of the same choice to this one's receipt, divided
    by the tokens of that choice in this output. An output bringing ``k`` tokens of a choice
    (several engine steps merged, as vLLM merges deltas for a reader that lags) counts ``k``
    observations of ``gap / k``, so ``_sum`` adds up to the time between first and last output
    and ``_count`` to the tokens after the first. Observed as outputs arrive, however the request
    ends. It is the latency braid's driver sees: it includes time the driver waited for the
    client to take the previous output (vLLM's own histogram observes once per engine step)."""
    e2e_latency: PlainHistogram = attrs.field(init=False)
    """``braid_e2e_request_latency_seconds``: per engine request that finished (not aborted, not
    failed), from the HTTP request's arrival to braid's receipt of its last output. Aborted and
    failed requests are counted by cause instead."""
    batch_lines: Counter = attrs.field(init=False)
    """``braid_batch_lines_total{outcome}``: lines of batch jobs that ended (braid.batch.runner)."""
    batch_jobs: Counter = attrs.field(init=False)
    """``braid_batch_jobs_ended_total{status}``: batch jobs that reached a final status here."""
    store_errors: Counter = attrs.field(init=False)
    """``braid_store_errors_total``: store calls the database failed (:class:`braid.errors.StoreUnavailable`)."""
    _abort_children: dict[str, Counter] = attrs.field(init=False)
    _batch_lines: dict[bool, Counter] = attrs.field(init=False)
    _forwarded: ForwardedFamilies | None = attrs.field(init=False, default=None)
    _queued: Callable[[], float] | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        r = self.registry
        self.in_flight = Gauge("braid_engine_requests_in_flight", "Engine requests braid is driving now", registry=r)
        self.aborts = Counter(
            "braid_engine_aborts",
            "Engine requests braid aborted before they finished, and prompts dropped before they reached "
            "the engine, by cause: disconnect (the client went away), error (another engine request of the "
            "batch failed, or braid did), stall (the client stopped reading), timeout (--request-timeout), "
            "drain (cut at the end of a drain), queue (a prompt still waiting for admission slots when "
            "its request ended; never in the engine)",
            ["cause"],
            registry=r,
        )
        # Children made once: labels() takes a lock and builds a key each call. Made now so every
        # cause is exposed as 0 before its first abort.
        self._abort_children = {cause: self.aborts.labels(cause=cause) for cause in ABORT_CAUSES}
        self.engine_requests = Counter("braid_engine_requests", "Engine requests braid started", registry=r)
        self.engine_errors = Counter("braid_engine_errors", "Engine requests that failed in the engine", registry=r)
        self.rejected = Counter("braid_admission_rejected", "Requests refused with 429: the queue was full", registry=r)
        self.http_responses = Counter(
            "braid_http_responses", "HTTP answers by route and status", ["route", "status"], registry=r
        )
        self.batch_lines = Counter(
            "braid_batch_lines",
            "Lines of batch jobs that ended, by outcome: completed (a row in the job's output file) or failed "
            "(a row in its error file: the route's error, or batch_expired); lines refused when the job was "
            "created are not counted",
            ["outcome"],
            registry=r,
        )
        self._batch_lines = {
            True: self.batch_lines.labels(outcome="completed"),
            False: self.batch_lines.labels(outcome="failed"),
        }
        self.batch_jobs = Counter(
            "braid_batch_jobs_ended",
            "Batch jobs that reached a final status on this server, by status: completed, failed, expired, cancelled",
            ["status"],
            registry=r,
        )
        for status in ("completed", "failed", "expired", "cancelled"):
            self.batch_jobs.labels(status=status)
        self.store_errors = Counter(
            "braid_store_errors",
            "Calls of braid's store that its database failed (PostgreSQL away, a disk full): each is a 503 "
            "on the store's routes, or a batch job stopped to run again later",
            registry=r,
        )
        self.queue_wait = Histogram(
            "braid_admission_queue_wait_seconds",
            "From a request's admission to its first engine slot",
            buckets=(0.001, 0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        self.prompts = Histogram(
            "braid_request_prompts",
            "Prompts per completions request that reached the engine",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096),
            registry=r,
        )
        self.time_to_first_token = PlainHistogram(
            "braid_time_to_first_token_seconds",
            "Per streamed engine request that got a token: from the HTTP request's arrival (queue wait "
            "included) to its first output with a token. Non-streaming requests are not observed",
            TTFT_BUCKETS,
            r,
        )
        self.inter_token_latency = PlainHistogram(
            "braid_inter_token_latency_seconds",
            "Per token of a streamed engine request after its choice's first output: the time since that "
            "choice's previous output, shared among the output's k tokens (k observations of gap/k)",
            ITL_BUCKETS,
            r,
        )
        self.e2e_latency = PlainHistogram(
            "braid_e2e_request_latency_seconds",
            "Per engine request that finished (not aborted, not failed): from the HTTP request's arrival "
            "(queue wait included) to its last output",
            E2E_BUCKETS,
            r,
        )

    def batch_line(self, ok: bool, count: int = 1) -> None:
        """Count ``count`` lines of batch jobs that ended (braid.batch.runner)."""
        self._batch_lines[ok].inc(count)

    def batch_ended(self, status: str) -> None:
        """Count a batch job that reached its final ``status``."""
        self.batch_jobs.labels(status=status).inc()

    def track_batches(self, active: Callable[[], float]) -> None:
        """Expose the batch jobs running now on this server (the runner's, read at scrape time)."""
        Gauge(
            "braid_batch_jobs_running", "Batch jobs this server is running lines of now", registry=self.registry
        ).set_function(active)

    def abort(self, cause: AbortCause, count: int = 1) -> None:
        """Count ``count`` engine requests (or dropped prompts) aborted for ``cause``."""
        self._abort_children[cause].inc(count)

    def track_engine_unfinished(self, read: Callable[[], float]) -> None:
        """Expose the engine's own count of unfinished requests (read at scrape time)."""
        g = Gauge(
            "braid_engine_unfinished_requests", "The engine's own count of unfinished requests", registry=self.registry
        )
        g.set_function(read)

    def track_admission(self, slots_in_use: Callable[[], float], queued: Callable[[], float]) -> None:
        """Expose admission's state (read at scrape time; see braid.stream.admit)."""
        Gauge(
            "braid_admission_slots_in_use", "Engine slots granted to requests now", registry=self.registry
        ).set_function(slots_in_use)
        Gauge(
            "braid_admission_queued_requests", "Requests waiting for their first engine slot", registry=self.registry
        ).set_function(queued)
        self._queued = queued

    def track_engine(self, families: EngineFamilies, queued: Callable[[], float]) -> None:
        """Expose the engine's own families (vLLM's ``vllm:*``) beside braid's, with ``queued()``
        (braid's admission queue, read at scrape time) added to the waiting gauges: braid holds
        the prompts that wait for engine slots itself, so the engine's own waiting count stays
        near 0 and would tell an autoscaler nothing."""
        self._forwarded = ForwardedFamilies(families, queued)
        self.registry.register(self._forwarded)

    def load_report(self) -> list[tuple[str, float]]:
        """The figures of an ORCA load report (:mod:`braid.http.orca`), named as vLLM names them,
        in vLLM's order: ``num_requests_waiting`` (the engine's waiting requests plus those in
        braid's admission queue, as ``vllm:num_requests_waiting`` shows them) and
        ``kv_cache_usage_perc`` (the engine's KV-cache use, 0 to 1), one per sample of those
        gauges. An engine without vLLM's families reports only the requests in admission's queue."""
        if self._forwarded is None:
            return [] if self._queued is None else [("num_requests_waiting", float(self._queued()))]
        out: list[tuple[str, float]] = []
        for family in self._forwarded.collect():
            name = ORCA_NAMES.get(family.name)
            if name is not None and family.type == "gauge":
                out.extend((name, float(sample.value)) for sample in family.samples)
        return out

    def render(self) -> bytes:
        return generate_latest(self.registry)


class TokenTimer:
    """Times one streamed engine request's outputs into ``braid_time_to_first_token_seconds`` and
    ``braid_inter_token_latency_seconds`` (definitions: :class:`Metrics`).

    One per driver; :meth:`seen` is called with each output as it is received, on the Trio thread.
    Its cost per output is a loop over the output's deltas (one for ``n=1``), and per delta a
    bisection and two additions; nothing is folded when the request ends.
    """

    __slots__ = ("_arrived", "_first", "_itl", "_last", "_ttft")

    def __init__(self, metrics: Metrics, arrived: float, choices: int) -> None:
        self._arrived = arrived
        self._ttft = metrics.time_to_first_token
        self._itl = metrics.inter_token_latency
        self._first = True  # no token yet
        self._last: list[float | None] = [None] * choices  # per choice: when its previous tokens came

    def seen(self, deltas: Sequence[_Delta], now: float) -> None:
        """An output with these deltas was received at ``now`` (Trio's clock)."""
        last = self._last
        for delta in deltas:
            k = len(delta.token_ids)
            if not k:
                continue  # text held back, or a finish without a token: no token to time
            prev = last[delta.index]
            last[delta.index] = now
            if prev is not None:
                gap = now - prev
                itl = self._itl
                itl.counts[bisect_left(itl.bounds, gap / k)] += k
                itl.sum += gap
            elif self._first:
                self._first = False
                self._ttft.observe(now - self._arrived)


__all__ = [
    "ABORT_CAUSES",
    "AbortCause",
    "EngineFamilies",
    "ForwardedFamilies",
    "Metrics",
    "PlainHistogram",
    "TokenTimer",
]
