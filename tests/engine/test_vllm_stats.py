"""braid.engine.vllm_stats.observe_all: a histogram fed in one pass reads as one fed value by value."""

from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry, Histogram

from braid.engine.vllm_stats import observe_all

# vLLM 0.32's inter-token latency buckets (vllm/v1/metrics/loggers.py), +Inf added by prometheus_client
ITL_BUCKETS = [
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
]


def _child(registry: CollectorRegistry) -> Histogram:
    family = Histogram("itl", "test", labelnames=["model_name", "engine"], buckets=ITL_BUCKETS, registry=registry)
    return family.labels("m", "0")


def _samples(registry: CollectorRegistry) -> dict[str, float]:
    return {
        f"{s.name}{sorted(s.labels.items())}": s.value
        for m in registry.collect()
        for s in m.samples
        if not s.name.endswith("_created")
    }


@pytest.mark.parametrize("seed", range(5))
def test_observe_all_counts_as_observe_does(seed: int) -> None:
    rng = random.Random(seed)
    # every bound exactly (a value on a bound is in that bound's bucket), between them, past the last
    values = [*ITL_BUCKETS, *(rng.uniform(0, 100) for _ in range(200)), *(rng.expovariate(50) for _ in range(200))]
    rng.shuffle(values)
    one_by_one, at_once = CollectorRegistry(), CollectorRegistry()
    expected = _child(one_by_one)
    for v in values:
        expected.observe(v)
    got = _child(at_once)
    observe_all(got, values[:150])
    observe_all(got, [])
    observe_all(got, values[150:])
    want, have = _samples(one_by_one), _samples(at_once)
    assert want.keys() == have.keys()
    for key, v in want.items():
        if "_sum" in key:
            assert have[key] == pytest.approx(v, rel=1e-12), key
        else:
            assert have[key] == v, key
