"""Every Prometheus collector rmqtrace registers, found by walking the package: one per registry.

A second copy on one registry must be refused with one clear error and leave the first scrapable;
a collector that slips past the registry's name check (an empty ``describe()``) breaks every
scrape with "Clashing name" instead. New collectors are found here without editing this file.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families

import tracer
from tracer.telemetry.registration import OnePerRegistry


def _tracer_classes() -> list[type]:
    found: dict[str, type] = {}
    for mod in pkgutil.walk_packages(tracer.__path__, "tracer."):
        if mod.name.endswith("__main__"):
            continue  # runs the CLI
        try:
            module = importlib.import_module(mod.name)
        except ImportError:  # an optional client (the 2.x binding) is absent here
            continue
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__.startswith("tracer."):
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return [found[k] for k in sorted(found)]


# Code that puts something on a registry: <a registry>.register(...), the base's _register(...), or
# a stock metric built with registry=<something other than None> (which registers itself). Only a
# name that says registry: a select.poll()'s register(fd) (the export child's writer) is no collector.
_REGISTERS = re.compile(r"\b\w*(?:registry|REGISTRY)\w*\.register\(|\b_register\(|\bregistry=(?!None\b)[A-Za-z_]")


def _registers(cls: type) -> bool:
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return False
    return bool(_REGISTERS.search(source))


CLASSES = _tracer_classes()
# Whatever can put itself on a registry: its code registers, or it derives from the base.
COLLECTORS = [c for c in CLASSES if c is not OnePerRegistry and (_registers(c) or issubclass(c, OnePerRegistry))]


def test_discovery_finds_the_known_collectors() -> None:
    names = {c.__name__ for c in COLLECTORS}
    assert {"TracerMetrics", "DispatchMetrics", "OccupancyMetrics", "ProbeMetrics"} <= names


@pytest.mark.parametrize("cls", COLLECTORS, ids=lambda c: c.__name__)
def test_every_collector_goes_through_the_one_registration_base(cls: type) -> None:
    assert issubclass(cls, OnePerRegistry), f"{cls.__qualname__} takes a registry but is not a OnePerRegistry"


def _scrape_is_sound(registry: CollectorRegistry) -> None:
    text = generate_latest(registry).decode()
    types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(types) == len(set(types)), "a family is exposed twice"
    families = list(text_string_to_metric_families(generate_openmetrics(registry).decode()))  # raised "Clashing name"
    assert families


@pytest.fixture(params=["single", "multiprocess"])
def mode(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "multiprocess":
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    else:
        monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
        monkeypatch.delenv("prometheus_multiproc_dir", raising=False)
    return str(request.param)


@pytest.mark.parametrize("cls", COLLECTORS, ids=lambda c: c.__name__)
def test_a_second_copy_on_one_registry_is_refused_and_the_scrape_still_works(cls: type, mode: str) -> None:
    registry = CollectorRegistry()
    first = cls(registry)
    with pytest.raises(ValueError, match=rf"already holds rmqtrace's {cls.__name__} series.*{cls.__name__}\.shared"):
        cls(registry)
    assert cls.shared(registry) is first
    _scrape_is_sound(registry)
    first.unregister()
    second = cls(registry)
    try:
        assert second is not first  # room again after unregister
        _scrape_is_sound(registry)
    finally:
        second.unregister()  # multiprocess: stops its refresher thread


@pytest.mark.parametrize("a", COLLECTORS, ids=lambda c: c.__name__)
def test_collectors_of_different_kinds_share_a_registry(a: type) -> None:
    registry = CollectorRegistry()
    for cls in COLLECTORS:
        cls(registry)  # every kind once: no two kinds clash
    assert a.shared(registry) is not None
    _scrape_is_sound(registry)


def test_a_collector_that_describes_nothing_is_refused() -> None:
    class Silent:
        def describe(self) -> list[object]:
            return []

        def collect(self) -> list[object]:
            return []

    class Bad(OnePerRegistry):
        def __init__(self, registry: CollectorRegistry) -> None:
            self._register(registry, [Silent()])

    with pytest.raises(TypeError, match="describes no series"):
        Bad(CollectorRegistry())


def test_unregister_stops_a_multiprocess_refresher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tracer.telemetry.occupancy import OccupancyMetrics

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    m = OccupancyMetrics(CollectorRegistry(), refresh_interval=0.01)
    thread = m._refresher._thread  # type: ignore[union-attr]
    assert thread is not None and thread.is_alive()
    m.unregister()
    thread.join(5)
    assert not thread.is_alive()
