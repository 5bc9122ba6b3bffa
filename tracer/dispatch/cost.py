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

Where it costs nothing: the producer. A job producer that knows every cost before sending (or
learned it: :mod:`.costtable`) can simply send longest first
(:meth:`~tracer.clients.producer.TracedProducer.send_job`, or :func:`longest_first` for a sort);
then even plain ``aggressive`` consumers start the long-tail groups first, with no window and no
extra lease time — and across a fleet of them it is the only lever (docs/dispatch.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from ..bounds import count
from ..callables import exact_str, require_plain, short_repr, unrun
from ..path.names import JOB_ORDERS
from .costtable import MAX_COST_S, CostTable, CostTableError, check_cost

T = TypeVar("T")

# What send_job writes on each message (property rmqtrace_order, span attribute rmqtrace.job.order);
# ARRIVAL: the order the messages were given in
LONGEST_FIRST, ARRIVAL = JOB_ORDERS


def longest_first(items: Iterable[T], cost: Callable[[T], float]) -> list[T]:
    """``items`` sorted by ``cost`` descending; equal costs keep their original order (stable)."""
    return sorted(items, key=cost, reverse=True)


def message_key(message: Any) -> str | None:
    """A message's first key, or None: ``keys`` of an embedded or 2.x message (a string or a
    sequence), or of a 5.x message (a set: its keys have no order, so the smallest)."""
    keys = getattr(message, "keys", None)
    if isinstance(keys, str):
        return keys or None
    if isinstance(keys, (list, tuple)) and keys and isinstance(keys[0], str):
        return keys[0] or None
    if isinstance(keys, (set, frozenset)) and keys and all(isinstance(k, str) for k in keys):
        return min(keys) or None
    return None


def table_cost(table: CostTable, key: Callable[[Any], str | None] = message_key) -> Callable[[Any], float]:
    """A ``cost=`` function for :class:`~tracer.clients.consume.ConsumeLoop` (``cost_aware``) or
    ``send_job``: a message's cost is ``table.cost(key(message))`` (unknown keys: the table's default)."""
    if not isinstance(table, CostTable):
        raise TypeError(f"table must be a CostTable (tracer.dispatch.costtable.load_costs), got {type(table).__name__}")
    require_plain(key, "key=")

    def cost(message: Any) -> float:
        return table.cost(_table_key(key, message))

    return cost


def _table_key(key: Callable[[Any], str | None], message: Any) -> str | None:
    """``key(message)`` for a table lookup, or :class:`CostTableError` saying ``key=`` failed: a key
    that is no str (bytes from a 2.x client, a set of keys) would miss every entry and take the
    default in silence — the dispatcher refuses such a key too (docs/dispatch.md)."""
    try:
        k = key(message)
    except Exception as exc:  # noqa: BLE001 - said as key='s, not as the cost's
        raise CostTableError(f"key= raised {type(exc).__name__}: {exc}") from exc
    if k is None or isinstance(k, str):
        return None if k is None else exact_str(k)
    kind = unrun(k)  # a returned coroutine is closed before the loud error: no "never awaited"
    raise CostTableError(f"key= returned {kind or type(k).__name__ + ' ' + short_repr(k)}, not a str or None")


def job_costs(messages: Sequence[Any], cost: Callable[[Any], float] | CostTable,
              key: Callable[[Any], str | None] = message_key) -> list[float]:
    """Every message's cost, checked before anything is sent: a cost must be a finite number
    >= 0. ``cost`` is a function of the message or a :class:`CostTable` (read through ``key``).

    Raises:
        CostTableError: a junk cost, or ``cost`` raised; the message names the message (its
            index in ``messages`` and its key).
        TypeError: ``cost`` is neither a function nor a table.
    """
    require_plain(key, "key=")
    if not isinstance(cost, CostTable) and not callable(cost):
        raise TypeError(f"cost= must be a function of the message or a CostTable, got {type(cost).__name__}")
    fn = table_cost(cost, key) if isinstance(cost, CostTable) else cost
    require_plain(fn, "cost=")
    keyed = isinstance(cost, CostTable)
    out: list[float] = []
    for i, m in enumerate(messages):
        try:
            if not keyed:  # a cost function does not read key=, but the job's errors name messages by it
                _table_key(key, m)
            value = fn(m)
        except CostTableError as exc:  # the table's key= or group= failed: said as theirs
            raise CostTableError(f"{exc} (for {which_message(i, key, m)})") from exc
        except Exception as exc:  # noqa: BLE001 - said with the message it failed on
            raise CostTableError(f"cost= raised {type(exc).__name__} for {which_message(i, key, m)}: {exc}") from exc
        if value.__class__ is float and 0.0 <= value < MAX_COST_S:  # the usual: no label built
            out.append(value)
        else:
            unrun(value)  # a returned coroutine is closed before the loud error: no "never awaited"
            out.append(check_cost(value, which_message(i, key, m)))
    return out


MAX_PRIORITY = 2**31 - 1  # a message's priority is an int32 on the wire (apache.rocketmq.v2.SystemProperties)


def check_priority_levels(levels: object) -> int | None:
    """``levels`` if a job can be spread over that many priority levels: None or an int in
    [1, 2**31] (the house's count rule, :func:`tracer.bounds.count`).

    Raises:
        TypeError: not a number.
        ValueError: a bool, a float, below 1 or above 2**31.
    """
    if levels is None:
        return None
    return count(levels, "priority_levels (the PRIORITY topic's queues)", minimum=1, maximum=MAX_PRIORITY + 1)


def job_priorities(costs: Sequence[float], levels: int) -> list[int]:
    """The priority of each message of a job, given its costs in the order it is sent, for a
    PRIORITY topic of ``levels`` queues: falling with the send order from ``levels - 1``, each
    level holding about ``1/levels`` of the job's work (a long message a level of its own, many
    short ones one level together).

    The broker stores a message of priority p in queue ``min(p, queues - 1)`` and every receive
    takes from the highest queue that holds one, each queue in send order: so it hands the job
    out in exactly the order sent, to whichever process asks. Spreading the levels by work keeps
    the concurrent receives of a fleet apart: one that finds a queue busy takes the next one
    down, the next longest.

    Raises:
        TypeError: ``levels`` not a number.
        ValueError: ``levels`` a bool, a float, below 1 or above 2**31; a cost that is not a
            finite number >= 0.
    """
    levels = count(levels, "levels", minimum=1, maximum=MAX_PRIORITY + 1)
    if any(not (0.0 <= c < MAX_COST_S) for c in costs):
        raise ValueError("every cost must be a finite number >= 0")
    total = float(sum(costs))
    top = levels - 1
    out: list[int] = []
    before = 0.0
    for c in costs:
        out.append(top - min(top, int(before / total * levels)) if total > 0.0 else top)
        before += c
    return out


def which_message(index: int, key: Callable[[Any], str | None], message: Any) -> str:
    """How an error names a message: its index in the job and, when it has one, its key."""
    try:
        k = key(message)
    except Exception:  # noqa: BLE001 - only for the error message
        k = None
    if isinstance(k, str):
        k = exact_str(k)
    else:
        unrun(k)  # a junk key= answer is only not shown (a coroutine closed: no "never awaited")
        k = None
    return f"message {index}" + (f" (key {k[:40]!r})" if k else "")


__all__ = ["ARRIVAL", "JOB_ORDERS", "LONGEST_FIRST", "MAX_PRIORITY", "check_priority_levels", "job_costs",
           "job_priorities", "longest_first", "message_key", "table_cost", "which_message"]
