"""Issue 31 item 8 and its siblings: every series rmqtrace registers that measures a consumer's
messages carries ``consumer_group``, so two consumers in one process (one scrape ``instance``) are
never summed into one series — a saturated group beside an idle one of another consumer read as
head-of-line blocking when the dispatcher gauges were summed by policy alone.

The series are discovered: every :class:`~tracer.telemetry.registration.OnePerRegistry` subclass
of the package is built on a fresh registry and every family it describes is checked. A family
without the label must be named below with the reason it belongs to no consumer group."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

import tracer
from tracer.telemetry.registration import OnePerRegistry

# series of the process or of a producer, not of one consumer group's messages
NOT_PER_GROUP = {
    "rmqtrace_spans_dropped": "the process's span exporter, shared by every consumer",
    "rmqtrace_spans_policy_dropped": "the process's hold, shared by every consumer",
    "rmqtrace_clock_skew_clamped": "per gap stage across the process's peers (the clock, not the group)",
    "rmqtrace_clock_skew_bound_seconds": "per peer clock (producer, broker), not per group",
    "rmqtrace_propagation_errors": "malformed carriers by kind, read before the message is attributed",
    "rmqtrace_probe_sent": "the probe's producer: no consumer group",
    "rmqtrace_probe_last_sent_timestamp_seconds": "the probe's producer: no consumer group",
}


def _attributes(obj: object) -> list[object]:
    """``obj``'s attribute values: from ``vars()``, or by name where it has no ``__dict__`` (a class
    compiled by mypyc, tracer.compiled, keeps its attributes in slots)."""
    try:
        return list(vars(obj).values())
    except TypeError:
        return [getattr(obj, n) for n in dir(obj) if not n.startswith("__") and hasattr(obj, n)]


def _families() -> dict[str, tuple[str, tuple[str, ...]]]:
    for mod in pkgutil.walk_packages(tracer.__path__, "tracer."):
        if ".tools" not in mod.name and not mod.name.endswith("__main__"):
            importlib.import_module(mod.name)
    kinds: list[type[Any]] = []
    todo = list(OnePerRegistry.__subclasses__())
    while todo:
        cls = todo.pop()
        kinds.append(cls)
        todo += cls.__subclasses__()
    assert {k.__name__ for k in kinds} >= {"TracerMetrics", "DispatchMetrics", "OccupancyMetrics", "ProbeMetrics"}
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for kind in kinds:
        metrics = kind(CollectorRegistry())
        for collector in metrics.collectors:
            # a stock metric, a custom family, or a wrapper around a stock metric
            inner = [collector, *(v for v in _attributes(collector) if isinstance(v, MetricWrapperBase))]
            for family in collector.describe():
                labels = getattr(family, "_labelnames", None) or next(
                    (m._labelnames for m in inner if getattr(m, "_name", None) == family.name), None)
                assert labels is not None or family.name not in out, family.name
                out[family.name] = (kind.__name__, tuple(labels or ()))
        metrics.unregister()
    return out


FAMILIES = _families()


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_consumer_series_is_labelled_by_consumer_group(name: str) -> None:
    kind, labels = FAMILIES[name]
    if name in NOT_PER_GROUP:
        assert "consumer_group" not in labels, f"{name} has consumer_group now: take it off NOT_PER_GROUP"
        return
    assert "consumer_group" in labels, f"{kind}: {name}{{{','.join(labels)}}} sums every consumer group"


def test_the_exemptions_name_only_series_that_exist() -> None:
    assert set(NOT_PER_GROUP) <= set(FAMILIES), set(NOT_PER_GROUP) - set(FAMILIES)
