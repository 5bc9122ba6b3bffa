"""Dispatch policies: small, immutable, reusable descriptions of how messages meet workers.

A policy is configuration (like tenacity's ``stop_after_attempt(3)``); :meth:`Policy.scheduler`
builds the per-dispatcher state machine from :mod:`.scheduler`. Names for ``policy="..."``:

``aggressive`` — :class:`Aggressive`
    N workers, one slot each. A message goes to whichever worker is free first; ``submit`` blocks
    while every worker holds a message (back-pressure to the puller), so nothing ages in a local
    buffer behind a long-tail message. ``free_slots()`` is the number of idle workers.

``cost_aware`` — :class:`CostAware`
    Aggressive plus a waiting room (``window``, W) of accepted messages; a freed worker starts the
    most expensive waiting one (by the dispatcher's ``cost=`` hint; ties and no hint: oldest first).
    See :mod:`.cost` for when this helps and what it costs.

``round_robin`` / ``random`` — :class:`RoundRobin` / :class:`Random`
    The incident SDK: every message is dealt up front to one worker's own buffer of K (``buffer``)
    in turn (or at random) and waits there even while other workers idle; ``submit`` blocks when
    the chosen worker's buffer is full. Kept to compare against, in the same run.

Ordering keys (``key=`` on the dispatcher): with the pool policies two messages of one key never run
at once and start in arrival order while other keys pass a slow one (keyed messages of a busy key
are parked, bounded by ``max_parked`` / the window). With the buffered policies a key is routed
to one fixed worker, as the incident SDK did.
"""

from __future__ import annotations

import random as _random
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from ..bounds import count
from .scheduler import BufferedScheduler, PoolScheduler, Scheduler


class Policy(ABC):
    """How a dispatcher hands messages to workers. ``name`` is the metrics ``policy`` label."""

    name: ClassVar[str]

    @abstractmethod
    def scheduler(self, workers: int) -> Scheduler:
        """A fresh state machine for one dispatcher with ``workers`` workers."""


@dataclass(frozen=True, slots=True)
class Aggressive(Policy):
    """One slot per worker; the first free worker takes the next message; submit blocks when full.

    ``max_parked``: how many keyed messages may wait behind their busy key (they hold no worker);
    a keyed message beyond that blocks ``submit`` like a full pool.
    """

    max_parked: int = 64
    name: ClassVar[str] = "aggressive"

    def __post_init__(self) -> None:
        count(self.max_parked, "max_parked", minimum=0)

    def scheduler(self, workers: int) -> Scheduler:
        return PoolScheduler(workers, window=0, park_limit=self.max_parked, name=self.name)


@dataclass(frozen=True, slots=True)
class CostAware(Policy):
    """Aggressive plus a window of ``window`` accepted, waiting messages; most expensive starts first.

    The window also bounds keyed messages parked behind a busy key. Without a ``cost=`` hint on the
    dispatcher every cost is 0 and the window is FIFO (aggressive with prefetch).
    """

    window: int = 64
    name: ClassVar[str] = "cost_aware"

    def __post_init__(self) -> None:
        count(self.window, "window (window 0 is Aggressive)", minimum=1)

    def scheduler(self, workers: int) -> Scheduler:
        return PoolScheduler(workers, window=self.window, name=self.name)


@dataclass(frozen=True, slots=True)
class RoundRobin(Policy):
    """Deal message i to worker i mod N, into that worker's buffer of ``buffer`` (K) waiting slots."""

    buffer: int = 10
    name: ClassVar[str] = "round_robin"

    def __post_init__(self) -> None:
        count(self.buffer, "buffer", minimum=0)

    def scheduler(self, workers: int) -> Scheduler:
        cursor = -1

        def draw() -> int:
            nonlocal cursor
            cursor = (cursor + 1) % workers
            return cursor

        return BufferedScheduler(workers, self.buffer, draw, name=self.name)


@dataclass(frozen=True, slots=True)
class Random(Policy):
    """Deal each message to a uniformly random worker's buffer of ``buffer`` (K) waiting slots.

    With ``seed`` the sequence of targets is reproducible (``random.Random(seed).randrange(N)``
    per unkeyed message, in submit order, as :func:`.simulate.simulate_random` assumes).
    """

    buffer: int = 10
    seed: int | None = None
    name: ClassVar[str] = "random"

    def __post_init__(self) -> None:
        count(self.buffer, "buffer", minimum=0)
        if self.seed is not None:
            count(self.seed, "seed", minimum=-(2**63))  # any int; a float or NaN seeds nothing reproducible

    def scheduler(self, workers: int) -> Scheduler:
        rng = _random.Random(self.seed)
        return BufferedScheduler(workers, self.buffer, lambda: rng.randrange(workers), name=self.name)


POLICY_NAMES: dict[str, type[Policy]] = {
    "aggressive": Aggressive,
    "cost_aware": CostAware,
    "round_robin": RoundRobin,
    "random": Random,
}


def resolve_policy(policy: Policy | str) -> Policy:
    """A :class:`Policy` as is, or the default instance for one of :data:`POLICY_NAMES`."""
    if isinstance(policy, Policy):
        return policy
    try:
        return POLICY_NAMES[policy]()
    except KeyError:
        raise ValueError(f"unknown dispatch policy {policy!r}; expected one of {sorted(POLICY_NAMES)}") from None


__all__ = ["POLICY_NAMES", "Aggressive", "CostAware", "Policy", "Random", "RoundRobin", "resolve_policy"]
