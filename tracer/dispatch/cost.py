"""Cost-aware start: when starting the most expensive message first helps, and what it costs.

Scheduling theory in one paragraph: with N identical workers and jobs known up front, any order
finishes no later than ``LB + longest`` after start (Graham), where
``LB = max(total work / N, longest job)`` is a lower bound no schedule beats; starting the longest
jobs first (LPT) is within 4/3 of the optimum and, for many small jobs with a few big ones, at LB
for all practical purposes. The harm of a long-tail job is that it *starts late*: if a 5-minute
test-case group is the last to start, the job ends 5 minutes after everything else.

When :class:`.policy.CostAware` helps
    Only when there is a choice: several messages already accepted and waiting when a worker frees
    — a prefetch window (``window=W``) filled faster than workers drain it, e.g. a job's whole batch
    arriving at once. Among those W the most expensive starts first. If messages trickle in one by
    one (the window is empty whenever a worker frees) it behaves exactly like ``aggressive``.
    With a window covering the whole job it approaches LB (see BENCHMARKS.md).

What it costs
    * Latency of cheap messages: a cheap message may wait while more expensive ones, even ones
      accepted after it, start first; under a steady stream of expensive messages it can wait a
      long time (there is no aging). Use it for batch jobs where the makespan matters, not for
      latency-sensitive traffic.
    * Longer leases: a message accepted into the window is received from the broker but not yet
      running, so its invisibility lease runs while it waits; the consume loop must extend leases
      of waiting messages too, or keep W small relative to the lease. Aggressive has no window
      and so no such waiting.
    * Memory and redelivery exposure of W received-but-unstarted messages on a crash.

Where it costs nothing: the producer. A job producer that knows every cost before sending can
simply send longest first (:func:`longest_first`); then even plain ``aggressive`` consumers start
the long-tail groups first, with no window and no extra lease time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


def longest_first(items: Iterable[T], cost: Callable[[T], float]) -> list[T]:
    """``items`` sorted by ``cost`` descending; equal costs keep their original order (stable)."""
    return sorted(items, key=cost, reverse=True)


__all__ = ["longest_first"]
