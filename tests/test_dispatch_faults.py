"""Faults at the dispatcher's edges (issue #30): junk from ``cost=``, unbounded and invalid close
timeouts, handlers that return something that never ran, gauges after a restart. Both engines."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import pytest

from tracer.dispatch import AsyncDispatcher, CostAware, Dispatcher
from tracer.path.stages import Outcome

ENGINES = ["threads", "asyncio"]


def _drive(engine: str, items: list[Any], *, cost: Callable[[Any], Any] | None = None,
           policy: Any = "aggressive", workers: int = 1) -> tuple[list[tuple[Any, Outcome]], Any]:
    """Submit ``items`` to a new dispatcher of ``engine``, close it (drain); the outcomes, the stats."""
    got: list[tuple[Any, Outcome]] = []

    def on_done(item: Any, outcome: Outcome, error: BaseException | None) -> None:
        got.append((item, outcome))

    if engine == "threads":
        d: Any = Dispatcher(lambda m: None, workers=workers, policy=policy, cost=cost, on_done=on_done)
        for it in items:
            d.submit(it)
        assert d.close() is True
        return got, d.statistics()

    async def handler(m: Any) -> None:
        return None

    async def main() -> Any:
        d = AsyncDispatcher(handler, workers=workers, policy=policy, cost=cost, on_done=on_done)
        for it in items:
            await d.submit(it)
        assert await d.close() is True
        return d.statistics()

    return got, asyncio.run(main())


class _BadFloat(float):
    """A number whose float() raises: ``numbers.Real`` passes, the conversion does not."""

    def __float__(self) -> float:
        raise ArithmeticError("no float")


# #30 item 10: every cost that cannot be a finite non-negative float
JUNK_COSTS = {
    "huge-int": 10**400,  # float() raises OverflowError
    "too-long-to-repr": 10**5000,  # repr() itself raises ValueError (int max str digits)
    "huge-fraction": Fraction(10**400, 3),
    "neg-huge-int": -(10**400),
    "nan": math.nan,
    "inf": math.inf,
    "negative": -1,
    "str": "3",
    "none": None,
    "bool": True,
    "complex": 1j,
    "float-raises": _BadFloat(1.0),
}


@pytest.mark.parametrize("junk", list(JUNK_COSTS))
@pytest.mark.parametrize("engine", ENGINES)
def test_a_cost_that_is_no_finite_number_takes_cost_zero_and_never_raises(engine: str, junk: str) -> None:
    value = JUNK_COSTS[junk]
    # fails before (huge-int, huge-fraction, neg-huge-int, float-raises): OverflowError/ArithmeticError out of submit
    got, s = _drive(engine, ["junk", "ok"], cost=lambda m: value if m == "junk" else 2.0,
                    policy=CostAware(window=4))
    assert sorted(got) == [("junk", Outcome.SUCCESS), ("ok", Outcome.SUCCESS)]
    assert s.cost_errors == 1 and s.handled == 2
