"""Exact event simulations of the dispatch policies with zero overhead, and the makespan lower bound.

All messages are available at time 0 in the given order, as when a job is dumped into a topic;
a single submitter feeds them in that order, blocking when the policy has no room, and a
dispatcher action costs no time. Comparing a real run with these isolates the dispatcher's own
overhead (``simulate_greedy``) or shows what a policy costs by construction
(``simulate_round_robin``).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Sequence


def lower_bound(durations: Sequence[float], workers: int) -> float:
    """No schedule on ``workers`` workers finishes before ``max(total / workers, longest)``.

    The one definition of the lower bound: the demo, the report and the bench import it from here.
    """
    _check(workers)
    if not durations:
        return 0.0
    return max(sum(durations) / workers, max(durations))


def simulate_greedy(durations: Sequence[float], workers: int) -> float:
    """Makespan when any free worker takes the next message in order (the aggressive policy)."""
    _check(workers)
    free = [(0.0, w) for w in range(workers)]  # (time the worker frees, worker)
    end = 0.0
    for d in durations:
        t, w = heapq.heappop(free)
        t += d
        end = max(end, t)
        heapq.heappush(free, (t, w))
    return end


def simulate_buffered(durations: Sequence[float], workers: int, buffer: int, targets: Sequence[int]) -> float:
    """Makespan when message i is dealt to worker ``targets[i]``'s own buffer of ``buffer`` (K).

    A worker holds one running message plus up to K waiting; the submitter blocks on a full target
    (delaying every later message, whatever its target) until that worker finishes one.
    """
    _check(workers)
    if buffer < 0:
        raise ValueError("buffer must be >= 0")
    if len(targets) < len(durations):
        raise ValueError("need one target per message")
    finishes: list[list[float]] = [[] for _ in range(workers)]  # per worker, in run order
    t_sub = 0.0
    for d, w in zip(durations, targets, strict=False):
        q = finishes[w]
        j = len(q)
        if j >= buffer + 1:  # message j enters when message j-(K+1) on that worker has finished
            t_sub = max(t_sub, q[j - buffer - 1])
        start = max(t_sub, q[-1]) if q else t_sub
        q.append(start + d)
    return max((q[-1] for q in finishes if q), default=0.0)


def simulate_round_robin(durations: Sequence[float], workers: int, buffer: int) -> float:
    """:func:`simulate_buffered` with message i dealt to worker ``i % workers`` (the incident SDK)."""
    return simulate_buffered(durations, workers, buffer, [i % workers for i in range(len(durations))])


def simulate_random(durations: Sequence[float], workers: int, buffer: int, seed: int | None) -> float:
    """:func:`simulate_buffered` with the targets :class:`.policy.Random` draws for ``seed``."""
    rng = random.Random(seed)
    return simulate_buffered(durations, workers, buffer, [rng.randrange(workers) for _ in durations])


def simulate_cost_aware(
    durations: Sequence[float], workers: int, window: int, costs: Sequence[float] | None = None
) -> float:
    """Makespan of :class:`.policy.CostAware`: a freed worker starts the costliest of ``window`` waiting.

    ``costs`` default to the durations (a perfect hint). Ties start the earlier message first. A
    message goes straight to an idle worker when nothing waits (so the first ``workers`` start in
    arrival order, as in the real engine).
    """
    _check(workers)
    if window < 1:
        raise ValueError("window must be >= 1")
    cs = durations if costs is None else costs
    n = len(durations)
    running: list[tuple[float, int]] = []  # (finish time, worker)
    idle = list(range(workers - 1, -1, -1))
    waiting: list[tuple[float, int]] = []  # (-cost, index)
    i = 0
    end = 0.0

    def admit(t: float) -> None:
        nonlocal i, end
        while i < n:
            if idle and not waiting:
                f = t + durations[i]
                end = max(end, f)
                heapq.heappush(running, (f, idle.pop()))
            elif len(waiting) < window:
                heapq.heappush(waiting, (-cs[i], i))
            else:
                return
            i += 1

    admit(0.0)
    while running:
        t, w = heapq.heappop(running)
        if waiting:
            _, j = heapq.heappop(waiting)
            f = t + durations[j]
            end = max(end, f)
            heapq.heappush(running, (f, w))
        else:
            idle.append(w)
        admit(t)
    return end


def _check(workers: int) -> None:
    if workers < 1:
        raise ValueError("workers must be >= 1")


__all__ = [
    "lower_bound",
    "simulate_buffered",
    "simulate_cost_aware",
    "simulate_greedy",
    "simulate_random",
    "simulate_round_robin",
]
