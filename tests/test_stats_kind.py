"""One snapshot verb, one kind of snapshot (issue 36 item 4; trio's ``statistics()``): every
stateful object of the package answers ``statistics()`` with a frozen, slotted dataclass whose
name ends in ``Stats``. The test finds them all: a new ``statistics()`` of another kind fails it."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import typing

import pytest

import tracer


def _owners() -> list[tuple[str, type]]:
    found: dict[str, type] = {}
    for info in pkgutil.walk_packages(tracer.__path__, "tracer."):
        if ".tools" in info.name or info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for _name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == info.name and callable(getattr(cls, "statistics", None)):
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return sorted(found.items())


_OWNERS = _owners()


def test_the_discovery_finds_the_known_owners() -> None:
    names = {name for name, _ in _OWNERS}
    assert {"tracer.telemetry.occupancy.Occupancy", "tracer.path.blocking.BlameTracker",
            "tracer.dispatch.engine.Dispatcher"} <= names


def _kind_problem(kind: type) -> str | None:
    if not dataclasses.is_dataclass(kind):
        return "not a dataclass"
    if not kind.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        return "not frozen"
    if "__slots__" not in vars(kind):
        return "not slotted"
    return None if kind.__name__.endswith("Stats") else "not named *Stats"


@pytest.mark.parametrize(("name", "cls"), _OWNERS, ids=[n for n, _ in _OWNERS])
def test_statistics_returns_a_frozen_slotted_stats_dataclass(name: str, cls: type) -> None:
    kind = typing.get_type_hints(cls.statistics)["return"]
    problem = _kind_problem(kind)
    # invariant: a dataclass, frozen, with __slots__ (no __dict__), named *Stats
    assert problem is None, f"{name}.statistics() returns {kind.__name__}: {problem}"
