"""The fleet bench's job, its bounds and one run's record (:mod:`tracer.tools.bench.fleet`).

A long-tailed job (most messages short, a few long), the lower bound and the greedy list schedule
it is measured against, and :class:`FleetRun`: what the members reported of one run, summarised.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from typing import Any, Sequence

from ...report.fleet import Handled, sweep_waits

__all__ = ["ENDPOINT", "KINDS", "MODES", "PREFETCH", "PRIORITY_QUEUES", "QUEUES", "FleetRun", "Handled", "fleet_greedy",
           "fleet_waits", "long_tail_job"]

ENDPOINT = "127.0.0.1:8081"
MODES = ("push_consumer", "prefetch", "demand_driven", "push_replacement")
# every consumer a member can be: the modes, and the two demand-driven ones with receive_ahead
KINDS = (*MODES, "demand_driven_ahead", "push_replacement_ahead")
PREFETCH = 32
QUEUES = 4
# a PRIORITY topic's queues, its priority levels (send_job spreads a job's work over them)
PRIORITY_QUEUES = 8


# -- the job and its bounds ------------------------------------------------------------------------
def long_tail_job(n: int, seed: int, *, long_share: float = 0.04, short_s: float = 0.03,
                  long_s: tuple[float, float] = (0.8, 4.0)) -> list[float]:
    """Handler seconds of ``n`` messages: most short (lognormal around ``short_s``), a few long.

    Raises:
        ValueError: ``n`` < 1.
    """
    if n < 1:
        raise ValueError(f"a job needs at least one message, got n={n}")
    rng = random.Random(seed)
    n_long = max(1, round(n * long_share))
    out = [min(0.25, short_s * rng.lognormvariate(0, 0.6)) for _ in range(n - n_long)]
    out += [rng.uniform(*long_s) for _ in range(n_long)]
    rng.shuffle(out)
    return [round(d, 4) for d in out]


def fleet_greedy(durations: Sequence[float], workers: int) -> float:
    """Makespan of greedy list scheduling in the given order: each message to the first free worker."""
    free = [0.0] * workers
    for d in durations:
        heapq.heapreplace(free, free[0] + d)
    return max(free)


def fleet_waits(records: Sequence[Handled], instances: int, workers: int, t0_ns: int) -> dict[str, Any]:
    """Sweep the members' stamps (:func:`tracer.report.fleet.sweep_waits` with W workers each)."""
    return sweep_waits(records, [workers] * instances, t0_ns)


# -- one run of one mode -----------------------------------------------------------------------------
@dataclass
class FleetRun:
    mode: str
    instances: int
    workers: int
    durations: list[float]
    t0_ns: int = 0
    records: list[Handled] = field(default_factory=list)
    occupancy: list[dict[str, float]] = field(default_factory=list)  # per member, at its exit
    errors: list[dict[str, int]] = field(default_factory=list)  # per member: its loop's errors_by_kind
    started_s: list[float] = field(default_factory=list)  # per member: "go" to its start() returning
    group: str = ""
    sent: list[int] | None = None  # message indexes in the order sent; None: job order

    def send_order(self) -> list[int]:
        return self.sent if self.sent is not None else list(range(len(self.durations)))

    def summary(self) -> dict[str, Any]:
        first: dict[int, Handled] = {}
        for r in self.records:
            if r.message not in first or r.end_ns < first[r.message].end_ns:
                first[r.message] = r
        handled = list(first.values())
        makespan = (max(r.end_ns for r in handled) - self.t0_ns) / 1e9
        measured = [0.0] * len(self.durations)
        for r in handled:
            measured[r.message] = (r.end_ns - r.start_ns) / 1e9
        n_workers = self.instances * self.workers
        lb = max(sum(measured) / n_workers, max(measured))
        greedy = fleet_greedy([measured[i] for i in self.send_order()], n_workers)  # in the order sent
        busy = [0.0] * self.instances
        count = [0] * self.instances
        for r in self.records:
            busy[r.instance] += (r.end_ns - r.start_ns) / 1e9
            count[r.instance] += 1
        waits = fleet_waits(self.records, self.instances, self.workers, self.t0_ns)
        return {
            "mode": self.mode,
            "makespan_s": round(makespan, 3),
            "lower_bound_s": round(lb, 3),
            "greedy_s": round(greedy, 3),
            # the same greedy on the job's planned durations: what the order sent decides, apart from
            # how long each handler really took on this machine
            "planned_greedy_over_lb": round(fleet_greedy([self.durations[i] for i in self.send_order()], n_workers)
                                            / max(sum(self.durations) / n_workers, max(self.durations)), 4),
            # the fleet's worker-time not in a handler until the job ended, per message: the hand-off
            # (receive, ack, start) plus the end's stragglers; what keeps a longest-first job off LB
            "idle_per_message_ms": round((n_workers * makespan - sum(measured)) / len(handled) * 1000, 1),
            "makespan_over_lb": round(makespan / lb, 3),
            "makespan_over_greedy": round(makespan / greedy, 3),
            "messages_per_instance": count,
            "busy_share_per_instance": [round(b / sum(busy), 3) if sum(busy) else 0.0 for b in busy],
            "max_held_unstarted": max(waits["max_held"]),
            "max_held_per_instance": waits["max_held"],
            "idle_worker_seconds": round(waits["fleet_idle_while_held_s"], 2),
            "inprocess_hol_seconds": round(sum(o.get("hol_s", 0.0) for o in self.occupancy), 2),
            "first_handler_s": round((min(r.start_ns for r in handled) - self.t0_ns) / 1e9, 3),
            # where the job's longest message came in the fleet's start order (0: first): under
            # the fleet's worker count it started in the first wave, as longest first means
            "longest_start_rank": sorted(handled, key=lambda r: r.start_ns).index(
                first[max(range(len(self.durations)), key=self.durations.__getitem__)]),
            "redelivered": len(self.records) - len(handled),
            # what a stalled start would show: a consumer's start() after "go", the loops' errors
            "member_start_s": max(self.started_s, default=0.0),
            "first_handler_per_instance": [
                round((min((r.start_ns for r in handled if r.instance == i), default=self.t0_ns) - self.t0_ns) / 1e9, 3)
                for i in range(self.instances)],
            "errors": {k: sum(e.get(k, 0) for e in self.errors) for k in sorted({k for e in self.errors for k in e})},
        }
