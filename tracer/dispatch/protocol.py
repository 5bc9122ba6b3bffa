"""Small shared types of the dispatcher: the trace protocol, the stats snapshot, the errors.

:class:`MessageTraceLike` is what the dispatcher needs from a message's trace (the tracer's own
object satisfies it structurally); the dispatcher never imports the telemetry layer.
"""

from __future__ import annotations

import enum
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from ..path.blocking import BlameStats
from ..path.stages import Outcome, Stage


class MessageTraceLike(Protocol):
    """The per-message trace the dispatcher stamps. ``None`` instead of one means "no tracing".

    Contract: the dispatcher calls :meth:`mark` with ``Stage.DISPATCH_ENQUEUE`` while it holds its
    internal lock at the moment ``submit`` accepts the item (so the stamp is never later than the
    handler start); the method must be cheap and must not call back into the dispatcher.
    :meth:`handler_scope` is entered right before the handler runs and exited right after it
    (the handler's exception, if any, is passed to ``__exit__``; returning True does not suppress
    it for the dispatcher). :meth:`finish` is called exactly once per accepted message, after the
    handler (or with ``Outcome.SKIPPED`` when ``close(drain=False)`` drops it unrun), before
    ``on_done``. One exception to "after the handler": the thread engine reports a handler still
    running at its ``handler_timeout`` deadline at once, from its watchdog thread, so ``finish``
    may come while ``handler_scope`` is still entered (it is exited, on the worker, when the
    handler returns). Exceptions from any of these are logged once per kind and swallowed. An
    optional writable ``worker`` attribute receives the worker's index before the handler starts.

    Optional extras: a method ``exemplar() -> Mapping[str, str] | None``; when present and metrics
    are enabled, its result is attached as the exemplar of the slot-wait observation (so a slow
    bucket links to the trace). A method ``abandon()``: called by ``close`` for every handler
    reported ``TIMEOUT`` that still runs when ``close`` returns (``close`` never waits for it), so
    the trace ends what it kept open for that handler's late return.
    """

    def mark(self, stage: Stage) -> None: ...

    def handler_scope(self) -> AbstractContextManager[object]: ...

    def finish(self, outcome: Outcome, error: BaseException | None) -> None: ...


class DispatchPhase(enum.IntEnum):
    """Where a dispatcher's life stands. It only moves forward (a second ``close`` leaves it where
    the first one took it), changed by the engine under its lock (or on its loop)."""

    OPEN = 0  # submit takes messages
    CLOSING = 1  # close() began: submit raises DispatcherClosed; workers still run what they hold
    STOPPING = 2  # close's wait ended: a worker that finds nothing to run exits
    # close's timeout passed first: what had not started was given back and nothing starts any
    # more; a handler still running reports when it returns (workers stop as in STOPPING)
    ABANDONED = 3


@dataclass(frozen=True, slots=True)
class DispatchStats:
    """A consistent snapshot (taken under the dispatcher's lock, or on the event loop).

    ``handled`` counts successes only. At every snapshot::

        submitted == handled + failed + timed_out + skipped + not_started + in_flight + queued

    ``in_flight`` counts messages a worker holds that have no outcome yet (running, or handed
    over and about to start); ``queued`` counts messages accepted but not yet held by a worker
    (a policy's buffers or window, or parked behind a busy ordering key). ``overrun`` counts
    workers still held by a handler that was already reported ``TIMEOUT`` (thread engine: the
    handler outlived ``handler_timeout`` and cannot be stopped); they are in ``timed_out``, not
    in ``in_flight``. ``waiters``: submitters blocked in ``submit``; ``watchers``: callers
    blocked in ``wait_for_free_slot``, ``wait_idle`` or ``close``. ``live_workers``: worker
    threads or tasks alive (asyncio: 0 before the first ``submit``). ``cost_errors``: ``cost=``
    results that raised or were not a finite number >= 0 (those messages got cost 0).
    ``not_started``: messages whose handler raised :class:`NotStarted`, or whose ``key=`` failed
    (they never reach a worker), both ``Outcome.NOT_STARTED``.
    ``phase``: the dispatcher's :class:`DispatchPhase` (open, or how far ``close`` got).
    ``blame``: live blame's snapshot (:class:`tracer.path.blocking.BlameStats`: starts
    judged, seconds waited and avoidable, head_of_line / capacity counts); None until a trace or
    metrics were attached.
    """

    submitted: int
    handled: int
    failed: int
    timed_out: int
    skipped: int
    in_flight: int
    queued: int
    workers: int
    policy: str
    waiters: int = 0
    watchers: int = 0
    overrun: int = 0
    live_workers: int = 0
    cost_errors: int = 0
    blame: BlameStats | None = None
    not_started: int = 0
    phase: DispatchPhase = DispatchPhase.OPEN


class DispatcherClosed(RuntimeError):
    """Raised by ``submit`` after ``close`` (also by a ``submit`` blocked when ``close`` began)."""


class NotStarted(Exception):
    """Raise it from a handler, before it does anything, to refuse to start this message: it is
    reported ``Outcome.NOT_STARTED`` (``on_done(item, NOT_STARTED, the exception)``), counted in
    ``not_started`` — not a failure, no handler duration measured, no error on its span.

    The consume loop raises it in place of the user's handler for a copy it must not start (its
    lease is gone, its key hangs, another copy of it still runs here).
    """


class HandlerTimeout(TimeoutError):
    """The error reported with ``Outcome.TIMEOUT``: the handler ran longer than ``handler_timeout``.

    ``__cause__`` holds the handler's own exception when it also raised.
    """

    def __init__(self, elapsed_s: float, timeout_s: float) -> None:
        super().__init__(f"handler ran {elapsed_s:.3f}s, longer than handler_timeout={timeout_s:g}s")
        self.elapsed_s = elapsed_s
        self.timeout_s = timeout_s


__all__ = ["DispatchPhase", "DispatchStats", "DispatcherClosed", "HandlerTimeout", "MessageTraceLike", "NotStarted"]
