"""A ``key=`` answer that is a ``str`` but misbehaves (review38 findings 07, 08): a ``str`` subclass
whose ``__hash__``/``__eq__`` raise, and a plain ``str`` holding a lone surrogate (what
``bytes.decode(..., "surrogateescape")`` gives). Each must route like the ``str`` it spells, on
both engines and under every policy, and in the cost table's lookup; the consume loop's own use
of the key is covered by the review's scripts (``tests/test_review38.py``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tracer.dispatch import AsyncDispatcher, CostAware, Dispatcher, Random, RoundRobin
from tracer.dispatch.cost import _table_key
from tracer.path.stages import Outcome


class HostileKey(str):
    def __hash__(self) -> int:
        raise RuntimeError("HostileKey.__hash__")

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("HostileKey.__eq__")


KEYS = {"str-subclass-raising-hash": lambda m: HostileKey("k"), "lone-surrogate": lambda m: "k\udc80"}
POLICIES = {"aggressive": lambda: "aggressive", "cost-aware": lambda: CostAware(window=4),
            "round-robin": lambda: RoundRobin(buffer=2), "random": lambda: Random(buffer=2, seed=1)}


def _run(engine: str, policy: str, key: Any) -> list[Outcome]:
    got: list[Outcome] = []
    kw: dict[str, Any] = dict(workers=2, policy=POLICIES[policy](), key=key, on_done=lambda m, o, e: got.append(o))
    if engine == "threads":
        d = Dispatcher(lambda m: None, **kw)
        for i in range(4):
            assert d.submit(i, timeout=5)
        assert d.close(timeout=10)
        return got

    async def main() -> None:
        async def handler(m: int) -> None:
            return None

        a = AsyncDispatcher(handler, **kw)
        for i in range(4):
            assert await a.submit(i, timeout=5)
        assert await a.close(timeout=10)

    asyncio.run(main())
    return got


@pytest.mark.parametrize("engine", ["threads", "asyncio"])
@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("which", sorted(KEYS))
def test_a_misbehaving_str_key_routes_like_its_text(engine: str, policy: str, which: str) -> None:
    # fails before: submit raised the key's RuntimeError (aggressive, cost-aware) or
    # UnicodeEncodeError (round-robin, random)
    assert _run(engine, policy, KEYS[which]) == [Outcome.SUCCESS] * 4


@pytest.mark.parametrize("which", sorted(KEYS))
def test_the_cost_table_reads_a_misbehaving_str_key_as_its_text(which: str) -> None:
    k = _table_key(KEYS[which], object())
    assert type(k) is str and {k: 1}[k] == 1
