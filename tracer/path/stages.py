"""The stage model: where a message is stamped, which clock took the stamp, and the gaps between.

A message is stamped at six stages. Each stamp is a wall-clock time in nanoseconds taken by one of
three clocks; gaps between stages taken by the same clock are exact, gaps that cross clocks carry
the two clocks' offset and are clamped at zero (see :mod:`tracer.stamps`).
"""

from __future__ import annotations

import enum
from typing import NamedTuple

__all__ = [
    "CROSS_CLOCK_GAPS", "GAPS", "GAP_BY_NAME", "GAP_INDEX", "HEADLINE_GAP", "PATH_GAPS", "STAGES", "STAGE_CLOCK",
    "STAGE_RESOLUTION_NS", "ClockDomain", "Gap", "Outcome", "Stage",
]


class Stage(enum.IntEnum):
    PRODUCE = 0
    BROKER_STORE = 1
    CLIENT_PULL = 2
    DISPATCH_ENQUEUE = 3
    HANDLER_START = 4
    HANDLER_END = 5


class ClockDomain(enum.Enum):
    PRODUCER = "producer"
    BROKER = "broker"
    CONSUMER = "consumer"


STAGE_CLOCK: dict[Stage, ClockDomain] = {
    Stage.PRODUCE: ClockDomain.PRODUCER,
    Stage.BROKER_STORE: ClockDomain.BROKER,
    Stage.CLIENT_PULL: ClockDomain.CONSUMER,
    Stage.DISPATCH_ENQUEUE: ClockDomain.CONSUMER,
    Stage.HANDLER_START: ClockDomain.CONSUMER,
    Stage.HANDLER_END: ClockDomain.CONSUMER,
}


class Gap(NamedTuple):
    name: str
    start: Stage
    end: Stage
    meaning: str
    crosses_clocks: bool
    peer: str  # the clock pair, e.g. ``producer->broker``: the key of the skew estimate
    tolerance_ns: int  # a negative gap this small is rounding, not skew
    position: int  # in GAPS


def _gap(index: int, name: str, start: Stage, end: Stage, meaning: str) -> Gap:
    a, b = STAGE_CLOCK[start], STAGE_CLOCK[end]
    return Gap(name, start, end, meaning, a is not b, f"{a.value}->{b.value}",
               max(STAGE_RESOLUTION_NS[start], STAGE_RESOLUTION_NS[end]), index)


# How coarse each stamp is. A negative cross-clock gap no larger than the coarser stamp's
# resolution is rounding, not skew: the broker stores milliseconds, we stamp nanoseconds.
STAGE_RESOLUTION_NS: dict[Stage, int] = {s: 1 for s in Stage}
STAGE_RESOLUTION_NS[Stage.BROKER_STORE] = 1_000_000

GAPS: tuple[Gap, ...] = (
    _gap(0, "send", Stage.PRODUCE, Stage.BROKER_STORE, "network + broker write"),
    _gap(1, "broker_wait", Stage.BROKER_STORE, Stage.CLIENT_PULL, "backlog / consumer lag"),
    _gap(2, "client_buffer", Stage.CLIENT_PULL, Stage.DISPATCH_ENQUEUE, "time in the client's local cache"),
    _gap(3, "dispatch_wait", Stage.DISPATCH_ENQUEUE, Stage.HANDLER_START, "waiting for a free worker"),
    _gap(4, "handler", Stage.HANDLER_START, Stage.HANDLER_END, "the handler's own work"),
    _gap(5, "end_to_end", Stage.PRODUCE, Stage.HANDLER_END, "what the user feels"),
    # The headline: everything a message waited inside the consumer after it arrived
    # (client_buffer + dispatch_wait). Which of the two parts is large depends on the SDK: a
    # prefetching client hides the wait in its cache (client_buffer), a demand-driven loop has
    # little of either; one number is comparable across both.
    _gap(6, "consumer_wait", Stage.CLIENT_PULL, Stage.HANDLER_START, "waiting inside the consumer"),
)
# Every gap as (position, first stage, last stage) in plain ints: the one table every per-message
# loop over the gaps reads (metrics, OTel meters, report columns); derived here, never retyped.
GAP_INDEX: tuple[tuple[int, int, int], ...] = tuple((g.position, int(g.start), int(g.end)) for g in GAPS)
CROSS_CLOCK_GAPS: tuple[Gap, ...] = tuple(g for g in GAPS if g.crosses_clocks)
GAP_BY_NAME: dict[str, Gap] = {g.name: g for g in GAPS}
# The gaps that tile the path from produce to handler end, in order (end_to_end is their sum).
PATH_GAPS: tuple[Gap, ...] = GAPS[:5]
# The one number to watch for the blind spot (demo, report, dashboard and alerts all lead with it).
HEADLINE_GAP: Gap = GAP_BY_NAME["consumer_wait"]


STAGES: tuple[Stage, ...] = tuple(Stage)  # iterating an enum class is slow on the hot path


class Outcome(str, enum.Enum):
    SUCCESS = "success"
    FAILURE = "failure"
    TIMEOUT = "timeout"
    SKIPPED = "skipped"
    # the handler refused to start this copy (tracer.dispatch.NotStarted: a consume loop whose
    # lease on it is gone, whose key hangs, whose other copy still runs): given back unrun, not a
    # failure, and no handler ran to be measured
    NOT_STARTED = "not_started"
