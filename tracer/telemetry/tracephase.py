"""The two life cycles of a received message's trace, each one field of
:class:`~tracer.telemetry.tracestate.TraceState`: its message path (:class:`TracePhase`) and its
keep decision (:class:`KeepFate`). What is not a life cycle stays a field of its own there: the
stamps (the handler's start and end), whether our spans were written, the reason a trace must be
kept, a late handler's end time.
"""

from __future__ import annotations

import enum

__all__ = ["KeepFate", "TracePhase"]


class TracePhase(enum.IntEnum):
    """Where a trace's message path stands (``TraceState._phase``). It only moves forward, under
    the tracer's ``_end_lock``; the message path reads it without the lock (one assignment per
    move). The handler's own run is in the stamps, not here: ``handler_start`` stamped and
    ``handler_end`` not is a handler running."""

    OPEN = 0  # received, not finished
    FINISHED = 1  # finish() ran (once): measured; its spans written, held or dropped
    # finished while its handler still ran (a watchdog's timeout): handler_end is the finish's,
    # the handler span stays open for the handler's return (or abandon())
    OVERRUN = 2
    LATE_ENDED = 3  # that handler returned, at _late_end, and its span ended there


class KeepFate(enum.IntEnum):
    """A trace's keep decision as the traces linking to it see it (``TraceState._fate``).

    Set when its spans open: HEAD (the head sampler decided: sampled is exported), HEAD_HELD
    (head-sampled under a hold: kept at its finish, aged out with its handler's spans if it never
    finishes) or UNDECIDED (dropped by the head, held for the keep policy). A held trace then moves
    under the tracer's ``_fate_lock``: DECIDING at its finish, then PENDING (its job's latest
    finisher, settled later), KEPT or DROPPED; a DROPPED one a link wants is GONE once one reviver
    took it, KEPT when the hold still had its spans. Whether a trace is held never changes after its
    spans open, so ``fate >= UNDECIDED`` is read without the lock."""

    HEAD = 0
    HEAD_HELD = 1
    UNDECIDED = 2
    DECIDING = 3
    PENDING = 4
    KEPT = 5
    DROPPED = 6
    GONE = 7
