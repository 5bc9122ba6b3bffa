"""The job view: completion against the lower bound, and the critical path of the message that ended last.

Definitions (job, completion, lower bound, critical path) in :mod:`tracer.report.model`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from ..dispatch.simulate import lower_bound
from ..path.stages import HEADLINE_GAP, PATH_GAPS, Stage
from .records import MessageRecord, starts_ends
from .stats import GapColumns, mean_busy

# The critical path split: what happened before the message existed, then the path gaps.
PRODUCED_LATE = "produced_late"

SPLIT_PARTS: tuple[str, ...] = (PRODUCED_LATE,) + tuple(g.name for g in PATH_GAPS)

# The path gaps the headline gap is made of: waiting for a worker, inside the consumer.
WAITING_PARTS: tuple[str, ...] = tuple(g.name for g in PATH_GAPS
                                       if g.start >= HEADLINE_GAP.start and g.end <= HEADLINE_GAP.end)


MIXED_ORDER = "mixed"  # a job whose messages say different send orders (or some say none)


def sent_order(records: Iterable[MessageRecord]) -> str:
    """The order a job was sent in, from its messages: one of :data:`~tracer.path.names.JOB_ORDERS`,
    :data:`MIXED_ORDER`, or "" when none of them recorded one (sent one at a time)."""
    orders = {r.order for r in records}
    if len(orders) == 1:
        return orders.pop()
    return MIXED_ORDER if orders else ""


@dataclass
class CriticalPath:
    """The message that finished last and where the job's completion went on its way."""

    message: MessageRecord
    split_s: dict[str, float]  # SPLIT_PARTS -> seconds; they add up to the job's completion
    waiting_s: float  # client_buffer + dispatch_wait: queued inside the consumer for a worker
    working_s: float  # its handler
    broker_s: float  # send + broker_wait
    idle_workers: float | None  # workers idle on average while it waited inside the consumer
    idle_in_broker: float | None  # workers idle on average while it waited in the broker
    verdict: str

    def as_dict(self) -> dict[str, Any]:
        return {"message": self.message.as_dict(), "split_s": self.split_s, "waiting_s": self.waiting_s,
                "working_s": self.working_s, "broker_s": self.broker_s, "idle_workers": self.idle_workers,
                "idle_in_broker": self.idle_in_broker, "verdict": self.verdict}


@dataclass
class JobStats:
    group: str
    job_id: str
    messages: int
    workers: int
    start_ns: int
    end_ns: int
    completion_s: float
    total_handler_s: float
    longest_handler_s: float
    longest_message_id: str
    lower_bound_s: float
    occupancy: float  # total handler / (workers × completion)
    critical: CriticalPath
    sent_order: str = ""  # sent_order() of its messages: longest_first, arrival, mixed, or "" (not recorded)

    @property
    def over_lb(self) -> float | None:
        return self.completion_s / self.lower_bound_s if self.lower_bound_s else None

    def as_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "critical"}
        d["over_lb"] = self.over_lb
        d["critical"] = self.critical.as_dict()
        return d


def _idle(intervals: Sequence[tuple[int, int]], workers: int, a_ns: int, b_ns: int) -> float | None:
    if not a_ns or not b_ns:
        return None
    busy = mean_busy(intervals, a_ns, b_ns)
    return None if busy is None else max(0.0, workers - busy)


def _verdict(split: dict[str, float], idle: float | None, idle_broker: float | None, workers: int) -> str:
    parts = {"waiting for a worker inside the consumer": sum(split[p] for p in WAITING_PARTS),
             "working (its own handler)": split["handler"],
             "waiting in the broker": split["send"] + split["broker_wait"],
             "not yet produced": split[PRODUCED_LATE]}
    what, secs = max(parts.items(), key=lambda kv: kv[1])
    line = f"mostly {what}: {secs:.3f} s of {sum(split.values()):.3f} s"
    window_idle = idle if what.startswith("waiting for") else idle_broker if what.endswith("broker") else None
    if window_idle is not None:
        line += f", while on average {window_idle:.1f} of {workers} workers were idle"
    return line


def job_stats(group: str, job_id: str, records: Sequence[MessageRecord], workers: int,
              group_intervals: Sequence[tuple[int, int]], columns: GapColumns | None = None,
              bounds: tuple[list[int], list[int]] | None = None) -> JobStats:
    """The job view of one job's records; ``group_intervals`` are every handler run of the group;
    ``columns`` and ``bounds`` (every record's start and end) the records' when the caller has them."""
    column = (columns if columns is not None else GapColumns(records)).seconds["handler"]
    ran = [k for k, v in enumerate(column) if v is not None]  # handled: both handler stamps present
    handled = [records[k] for k in ran]
    starts, ends = bounds if bounds is not None else starts_ends(records)
    start, end = min(starts), max(ends)
    completion = (end - start) / 1e9
    handler_s: list[float] = [column[k] for k in ran]  # type: ignore[misc]  # not None there
    total_h = sum(handler_s)
    longest = handled[max(range(len(handled)), key=handler_s.__getitem__)] if handled else None  # the first of the longest
    longest_s = longest.handler_s if longest else 0.0
    lb = lower_bound(handler_s, workers) if workers else longest_s
    last = records[max(range(len(records)), key=lambda k: (ends[k], starts[k]))]
    split = {PRODUCED_LATE: max(0, last.start_ns - start) / 1e9}
    split.update({g.name: last.gap_s(g.name) for g in PATH_GAPS})
    idle = idle_broker = None
    if last.handled:
        pulled = last.t(Stage.CLIENT_PULL) or last.t(Stage.DISPATCH_ENQUEUE)
        idle = _idle(group_intervals, workers, pulled, last.t(Stage.HANDLER_START))
        idle_broker = _idle(group_intervals, workers, last.t(Stage.BROKER_STORE) or last.t(Stage.PRODUCE), pulled)
    critical = CriticalPath(
        last, split, waiting_s=sum(split[p] for p in WAITING_PARTS), working_s=split["handler"],
        broker_s=split["send"] + split["broker_wait"], idle_workers=idle, idle_in_broker=idle_broker,
        verdict=_verdict(split, idle, idle_broker, workers))
    return JobStats(group, job_id, len(records), workers, start, end, completion, total_h, longest_s,
                    longest.message_id if longest else "", lb,
                    total_h / (workers * completion) if workers and completion else 0.0, critical,
                    sent_order(records))


__all__ = [
    "CriticalPath", "JobStats", "MIXED_ORDER", "PRODUCED_LATE", "SPLIT_PARTS", "WAITING_PARTS", "job_stats",
    "sent_order"
]
