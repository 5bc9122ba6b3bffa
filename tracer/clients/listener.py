"""One wrapping of a user's per-message callback, shared by every push seam.

The 5.x ``MessageListener.consume`` (:class:`tracer.clients.official.TracedListener`) and the 2.x
``subscribe`` callback (:func:`tracer.clients.legacy.traced_callback`) differ only in how a
message is read, where its pull time comes from and what counts as success; a :class:`Seam`
names those three, and :func:`traced_consume` does the rest once: stamps, the handler scope, the
outcome, and the rule that tracing never stops consumption while the user's exceptions and
results pass through untouched.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

from ..callables import never_ran
from ..path.message import MessageInfo, body_of
from ..path.stages import Outcome, Stage
from ..telemetry.tracer import MessageTrace, MessageTracer
from .probe import settle_probe

__all__ = ["Seam", "traced_consume"]


class Seam(NamedTuple):
    """What one client's push callback needs to be traced."""

    describe: Callable[[Any], MessageInfo]
    pulled_ns: Callable[[MessageInfo], int | None]  # when the client received it; None: now
    succeeded: Callable[[Any], bool]  # the callback's result
    where: str  # named in the log when starting a trace fails
    success: Any = None  # the callback result that acks: what a settled probe returns
    callback: str = "listener"  # its name in errors: "message_listener.consume", "callback"


def traced_consume(tracer: MessageTracer, seam: Seam, call: Callable[[Any], Any], message: Any) -> Any:
    """``call(message)`` as one traced message: the client dispatched it to this thread when it
    entered, so ``dispatch_enqueue`` is the pull time and the wait before us is ``dispatch_wait``.
    Exceptions count as failures and are re-raised (``BaseException`` too); so does a returned
    coroutine or generator (closed, raised as :class:`~tracer.callables.HandlerNeverRan`)."""
    trace: MessageTrace | None
    try:
        info = seam.describe(message)
        trace = tracer.start_message(info, seam.pulled_ns(info), body_of(tracer, message))
        trace.mark(Stage.DISPATCH_ENQUEUE, trace.stamps.get(Stage.CLIENT_PULL))
    except Exception as exc:  # noqa: BLE001 - never let tracing stop consumption
        tracer.hook_failed(seam.where, exc)
        trace = None
    if trace is None:
        return _ran(call(message), seam)
    if settle_probe(tracer, trace):  # a probe: acked, the user's callback never sees it
        return seam.success
    try:
        with trace.handler_scope():
            result = _ran(call(message), seam)
    except BaseException as exc:
        trace.finish(Outcome.FAILURE, exc)
        raise
    trace.finish(Outcome.SUCCESS if seam.succeeded(result) else Outcome.FAILURE)
    return result


def _ran(result: Any, seam: Seam) -> Any:
    """``result``, unless it says the callback's body never ran (a returned coroutine): then that
    failure is raised, so the client retries the message as after any exception of the callback."""
    unrun = never_ran(result, seam.callback)
    if unrun is not None:
        raise unrun
    return result
