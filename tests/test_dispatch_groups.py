"""Every dispatcher series is per consumer group: two groups' dispatchers sharing one
DispatchMetrics (one per registry) are never summed into one series.

Review #31 finding 15: the outcome counter and the slot-wait/submit-blocked histograms carried
only ``policy``, so g1's failures and g2's successes (and their slot waits) landed in one series.
The families are found in the registry, so a new dispatcher series is covered without an edit.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from tracer.dispatch import Dispatcher, DispatchMetrics


def _families(reg: CollectorRegistry) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    return {f.name: [(s.name, dict(s.labels), s.value) for s in f.samples]
            for f in reg.collect() if f.name.startswith("rmqtrace_dispatch_")}


def _two_groups() -> CollectorRegistry:
    reg = CollectorRegistry()
    m = DispatchMetrics(reg)

    def fails(i: int) -> None:
        raise ValueError(i)

    for group, handler in (("g1", fails), ("g2", lambda i: None)):
        with Dispatcher(handler, workers=1, metrics=m, on_done=lambda *a: None, consumer_group=group) as d:
            d.submit(1)
    return reg


FAMILIES = sorted(_families(_two_groups()))


def test_the_families_are_found() -> None:
    assert {"rmqtrace_dispatch_messages", "rmqtrace_dispatch_slot_wait_seconds",
            "rmqtrace_dispatch_submit_blocked_seconds", "rmqtrace_dispatch_workers"} <= set(FAMILIES)


@pytest.fixture(scope="module")
def two_groups() -> Iterator[CollectorRegistry]:
    yield _two_groups()


@pytest.mark.parametrize("family", FAMILIES)
def test_every_series_names_its_consumer_group(family: str, two_groups: CollectorRegistry) -> None:
    samples = _families(two_groups)[family]
    assert samples and all({"policy", "consumer_group"} <= set(labels) for _, labels, _ in samples), samples
    assert {labels["consumer_group"] for _, labels, _ in samples} == {"g1", "g2"}


def test_one_groups_failures_are_not_the_others() -> None:
    reg = _two_groups()

    def count(group: str, outcome: str) -> float | None:
        return reg.get_sample_value("rmqtrace_dispatch_messages_total",
                                    {"policy": "aggressive", "consumer_group": group, "outcome": outcome})

    assert (count("g1", "failure"), count("g1", "success")) == (1, 0)
    assert (count("g2", "failure"), count("g2", "success")) == (0, 1)
    for family in ("rmqtrace_dispatch_slot_wait_seconds_count", "rmqtrace_dispatch_submit_blocked_seconds_count"):
        for group in ("g1", "g2"):
            assert reg.get_sample_value(family, {"policy": "aggressive", "consumer_group": group}) == 1
