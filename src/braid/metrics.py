"""Prometheus metrics, one registry per app (so tests and several apps in a process do not mix)."""

from __future__ import annotations

from collections.abc import Callable

import attrs
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

# The *_created series double the output and no dashboard of ours reads them.
disable_created_metrics()


@attrs.define(eq=False)
class Metrics:
    registry: CollectorRegistry = attrs.field(factory=CollectorRegistry)
    in_flight: Gauge = attrs.field(init=False)
    aborts: Counter = attrs.field(init=False)
    engine_requests: Counter = attrs.field(init=False)
    engine_errors: Counter = attrs.field(init=False)
    rejected: Counter = attrs.field(init=False)
    http_responses: Counter = attrs.field(init=False)
    queue_wait: Histogram = attrs.field(init=False)
    prompts: Histogram = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        r = self.registry
        self.in_flight = Gauge("braid_engine_requests_in_flight", "Engine requests braid is driving now", registry=r)
        self.aborts = Counter("braid_engine_aborts", "Engine requests braid aborted before they finished", registry=r)
        self.engine_requests = Counter("braid_engine_requests", "Engine requests braid started", registry=r)
        self.engine_errors = Counter("braid_engine_errors", "Engine requests that failed in the engine", registry=r)
        self.rejected = Counter("braid_admission_rejected", "Requests refused with 429: the queue was full", registry=r)
        self.http_responses = Counter(
            "braid_http_responses", "HTTP answers by route and status", ["route", "status"], registry=r
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

    def track_engine_unfinished(self, read: Callable[[], float]) -> None:
        """Expose the engine's own count of unfinished requests (read at scrape time)."""
        g = Gauge(
            "braid_engine_unfinished_requests", "The engine's own count of unfinished requests", registry=self.registry
        )
        g.set_function(read)

    def track_admission(self, slots_in_use: Callable[[], float], queued: Callable[[], float]) -> None:
        """Expose admission's state (read at scrape time; see braid.admit)."""
        Gauge(
            "braid_admission_slots_in_use", "Engine slots granted to requests now", registry=self.registry
        ).set_function(slots_in_use)
        Gauge(
            "braid_admission_queued_requests", "Requests waiting for their first engine slot", registry=self.registry
        ).set_function(queued)

    def render(self) -> bytes:
        return generate_latest(self.registry)
