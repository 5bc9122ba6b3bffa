"""Traced sending for any producer with the 5.x surface (``send``, ``send_async``).

``TracedProducer`` wraps one producer object; the instrumentor patches the class instead. Both
call :func:`traced_send`, so the ``send {topic}`` span and the properties written are the same.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any, Callable

from opentelemetry.instrumentation.utils import suppress_instrumentation

from ..dispatch.cost import (
    JOB_ORDERS,
    LONGEST_FIRST,
    check_priority_levels,
    job_costs,
    job_priorities,
    message_key,
    which_message,
)
from ..dispatch.costtable import CostTable
from ..path.message import client_facts, key_tuple
from ..path.names import JOB_ORDER_PROPERTY
from ..telemetry.futures import future_error
from ..telemetry.tracer import MessageTracer, SendTrace
from .route import explain_route_failure

__all__ = ["JobSendError", "ProducerProxy", "SendExplainer", "SendOpener", "TracedProducer", "check_job_id",
           "check_markable", "clear_priority", "explain_send_failure", "ordered_job", "plan_priorities", "priority_refusal",
           "send_ordered", "start_send", "traced_send", "traced_send_async"]


def _setter(message: Any) -> Callable[[str, str], object]:
    add = getattr(message, "add_property", None)
    if add is not None:
        return add  # type: ignore[no-any-return]
    props = getattr(message, "properties", None)
    if isinstance(props, dict):
        return props.__setitem__
    raise TypeError(f"{type(message).__name__} has no add_property()")


def start_send(tracer: MessageTracer, message: Any, job_id: str | None = None,
               cost: float | None = None) -> SendTrace:
    keys = key_tuple(getattr(message, "keys", None))
    body = getattr(message, "body", None)
    due = getattr(message, "delivery_timestamp", None)  # ms; set on a 5.x delay message
    return tracer.start_send(
        str(getattr(message, "topic", "") or ""), _setter(message),
        tag=getattr(message, "tag", None),
        keys=keys,
        message_group=getattr(message, "message_group", None),
        job_id=job_id, cost=cost,
        body_size=len(body) if isinstance(body, (bytes, bytearray, str)) else None,
        delivery_ms=due if isinstance(due, int) and not isinstance(due, bool) and due > 0 else None,
    )


SendOpener = Callable[[MessageTracer, Any, "str | None", "float | None"], SendTrace]
# (the send's exception, the client, the message) -> the exception to raise instead, or None
SendExplainer = Callable[[BaseException, Any, Any], "Exception | None"]


def explain_send_failure(exc: BaseException, client: Any, message: Any) -> Exception | None:
    """The 5.x client's "failed to fetch topic:T route." as a :class:`.route.TopicRouteError`
    (broker down or topic missing, and the next step); None for any other error. Never raises."""
    return explain_route_failure(exc, client, getattr(message, "topic", None))


def _explained(explain: SendExplainer, exc: BaseException, send: Callable[..., Any], message: Any) -> Exception | None:
    try:
        return explain(exc, getattr(send, "__self__", None), message)
    except Exception:  # noqa: BLE001 - the client's own error is raised then
        return None


def traced_send(tracer: MessageTracer, send: Callable[..., Any], message: Any, *args: Any,
                job_id: str | None = None, cost: float | None = None, opener: SendOpener = start_send,
                explain: SendExplainer = explain_send_failure, id_attr: str = "message_id", **kwargs: Any) -> Any:
    """``send(message, ...)`` inside a ``send {topic}`` span; the user's exceptions pass through.
    The client's "no route for this topic" becomes a :class:`.route.TopicRouteError` that says
    whether the broker is down or the topic missing, and the next step.

    ``opener`` reads the message and ``explain`` the client's route failure (the 2.x client's
    differ); ``id_attr`` names the receipt's message id."""
    try:
        st = opener(tracer, message, job_id, cost)
    except Exception as exc:  # noqa: BLE001 - our failure must not stop the send
        tracer.hook_failed("starting the send span", exc)
        return send(message, *args, **kwargs)
    try:
        with suppress_instrumentation():  # an instrumented client must not trace this send again
            receipt = send(message, *args, **kwargs)
    except BaseException as exc:
        st.end(error=exc)
        explained = _explained(explain, exc, send, message)
        if explained is not None:
            # the client says the same for a broker that is down and for a topic that is missing;
            # say which, and what to do (client_error keeps its own)
            raise explained from None
        raise
    st.end(message_id=getattr(receipt, id_attr, None))
    return receipt


def traced_send_async(tracer: MessageTracer, send_async: Callable[..., Future[Any]], message: Any,
                      *args: Any, job_id: str | None = None, cost: float | None = None,
                      **kwargs: Any) -> Future[Any]:
    """``send_async(message, ...)`` inside a ``send {topic}`` span ended by the future. A route
    failure is explained as :func:`traced_send` does: the 5.x client raises it from the call itself
    (it picks the queue before it returns the future), never through the future."""
    try:
        st = start_send(tracer, message, job_id, cost)
    except Exception as exc:  # noqa: BLE001
        tracer.hook_failed("starting the send span", exc)
        return send_async(message, *args, **kwargs)
    try:
        with suppress_instrumentation():
            fut = send_async(message, *args, **kwargs)
    except BaseException as exc:
        st.end(error=exc)
        explained = _explained(explain_send_failure, exc, send_async, message)
        if explained is not None:
            raise explained from None
        raise

    def _done(f: Future[Any]) -> None:
        exc = future_error(f)
        st.end(message_id=None if exc else getattr(f.result(), "message_id", None), error=exc)

    fut.add_done_callback(_done)
    return fut


class ProducerProxy:
    """A proxy around one producer object: subclasses trace the send methods, everything else
    passes through to the wrapped producer."""

    def __init__(self, producer: Any, tracer: MessageTracer) -> None:
        self._producer = producer
        self._tracer = tracer
        tracer.describe_client(client_facts(producer))

    @property
    def wrapped(self) -> Any:
        return self._producer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)


def ordered_job(messages: Sequence[Any], cost: Callable[[Any], float] | CostTable, order: str = LONGEST_FIRST,
                key: Callable[[Any], str | None] = message_key) -> list[tuple[Any, float]]:
    """``(message, cost)`` of one job in the order to send it: ``"longest_first"`` (stable: equal
    costs keep their order) or ``"arrival"`` (as given). Every cost is checked before any is sent.

    Raises:
        ValueError: an unknown ``order``; a junk cost or a raising ``cost`` (naming the message).
        TypeError: ``cost`` is neither a function of the message nor a :class:`CostTable`.
    """
    if order not in JOB_ORDERS:
        raise ValueError(f"order must be one of {', '.join(JOB_ORDERS)}, got {order!r}")
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TypeError(f"messages must be a sequence of messages (one job), got {type(messages).__name__}")
    costs = job_costs(messages, cost, key)
    pairs = list(zip(messages, costs))
    if order == LONGEST_FIRST:
        pairs.sort(key=lambda p: p[1], reverse=True)  # sort is stable with reverse=True too
    return pairs


def priority_refusal(message: Any) -> str | None:
    """Why a 5.x-surface ``message`` cannot carry a priority, or None when it can."""
    if not hasattr(type(message), "priority"):
        return (f"({type(message).__name__}) has no priority: a PRIORITY topic needs the 5.x client's "
                "Message (rocketmq-python-client >= 5.1)")
    for exclusive in ("message_group", "delivery_timestamp", "lite_topic"):
        if getattr(message, exclusive, None):
            return (f"has a {exclusive}; a message with a priority can have none (a PRIORITY topic holds "
                    "neither FIFO nor delay messages)")
    return None


def plan_priorities(messages: Sequence[Any], pairs: Sequence[tuple[Any, float]], levels: int | None,
                    key: Callable[[Any], str | None] = message_key,
                    refusal: Callable[[Any], str | None] = priority_refusal) -> list[int] | None:
    """The priority of each message of a job on a PRIORITY topic of ``levels`` queues, in the
    order it will be sent (``pairs``: :func:`ordered_job`; :func:`~tracer.dispatch.cost.job_priorities`:
    the broker then hands the job out in exactly that order), after checking that every message
    (``messages``, in the order given) can carry one. Changes nothing: each message gets its
    priority just before its own send (a job that fails midway leaves the unsent ones as they
    were). None for ``levels`` None.

    Raises:
        TypeError: ``levels`` not an int.
        ValueError: ``levels`` below 1; a message that cannot carry a priority (a FIFO message
            with a message group, a delay message, one without a priority), named by its index
            in ``messages``.
    """
    levels = check_priority_levels(levels)
    if levels is None:
        return None
    for i, m in enumerate(messages):
        why = refusal(m)
        if why is not None:
            raise ValueError(f"priority_levels: {which_message(i, key, m)} {why}")
    return job_priorities([c for _, c in pairs], levels)


def clear_priority(message: Any) -> None:
    """Take a priority off ``message`` again (a failed send of a job sent with priorities: resent
    to a normal topic it must be a plain message). The 5.x client's setter refuses None, so its
    own field is reset (``Message.__priority``, 5.1.2), as the embedded broker's. Never raises."""
    for field in ("_Message__priority", "_priority"):
        if field in getattr(message, "__dict__", {}):
            with contextlib.suppress(Exception):
                setattr(message, field, None)


def check_markable(messages: Sequence[Any], key: Callable[[Any], str | None] = message_key,
                   mark: Callable[[Any], object] = lambda m: _setter(m)) -> None:
    """Every message of a job can carry the order property (``mark`` finds its setter without
    calling it): a junk message in the middle of a job is refused before the first send.

    Raises:
        TypeError: one cannot, named by its index.
    """
    for i, m in enumerate(messages):
        try:
            mark(m)
        except Exception as exc:  # noqa: BLE001 - said with the message
            raise TypeError(f"send_job: {which_message(i, key, m)} is not a message: {exc}") from None


class JobSendError(RuntimeError):
    """A send of :meth:`TracedProducer.send_job` raised: what went and what did not, so exactly the
    rest can be sent again. ``__cause__`` is the send's own exception.

    Attributes:
        sent: ``(message, receipt)`` of the messages sent before it, in send order.
        failed: the message whose send raised (it may or may not have reached the broker).
        unsent: the messages after it, never tried, in the order they would have been sent.
    """

    def __init__(self, message: str, sent: list[tuple[Any, Any]], failed: Any, unsent: list[Any]) -> None:
        super().__init__(message)
        self.sent = sent
        self.failed = failed
        self.unsent = unsent


def check_job_id(job_id: object) -> str | None:
    """``job_id`` if a job can carry it: None or a non-empty str. A falsy or non-str one would be
    dropped at the send (the property is refused or skipped) and every message go without it."""
    if job_id is None:
        return None
    if not isinstance(job_id, str):
        raise TypeError(f"job_id must be a str or None, got {type(job_id).__name__}")
    if not job_id.strip():
        raise ValueError("job_id must not be blank")
    return job_id


def send_ordered(pairs: Sequence[tuple[Any, float]], order: str, job_id: str | None,
                 send: Callable[[Any, float], Any], mark: Callable[[Any], object],
                 unmark: Callable[[Any], object] | None = None) -> list[Any]:
    """Send one job's ``(message, cost)`` pairs in order, each first marked with the order
    (``mark``): the loop of every producer's ``send_job``. ``unmark``: what a message whose
    send raised gets back (its priority taken off, so it resends as it was given).

    Raises:
        JobSendError: a send raised an ``Exception`` (its ``__cause__``); says what was sent.
        BaseException: a ``KeyboardInterrupt`` … passes through, with a note of what was sent.
    """
    receipts: list[Any] = []
    for i, (message, c) in enumerate(pairs):
        try:
            mark(message)
            receipts.append(send(message, c))
        except Exception as exc:
            if unmark is not None:
                unmark(message)
            sent = [(m, r) for (m, _), r in zip(pairs, receipts)]
            unsent = [m for m, _ in pairs[i + 1:]]
            raise JobSendError(
                f"send_job{f' {job_id!r}' if job_id else ''}: the send of message {i + 1} of {len(pairs)} "
                f"({order}) raised {type(exc).__name__}: {exc}; {len(sent)} sent before it, {len(unsent)} not "
                "tried (.sent, .failed, .unsent)", sent, message, unsent) from exc
        except BaseException as exc:
            if sys.version_info >= (3, 11):  # a note is all a Ctrl-C can carry
                exc.add_note(f"send_job: {len(receipts)} of {len(pairs)} messages sent before it")
            raise
    return receipts


class TracedProducer(ProducerProxy):
    """``send``/``send_async`` of a 5.x-surface producer, traced; :meth:`send_job` sends a job
    longest first.

    ``job_id`` and ``cost`` keyword arguments are ours and are not passed to the client.
    """

    def send_job(self, messages: Sequence[Any], *, cost: Callable[[Any], float] | CostTable,
                 job_id: str | None = None, order: str = LONGEST_FIRST,
                 key: Callable[[Any], str | None] = message_key, priority_levels: int | None = None) -> list[Any]:
        """Send one job's ``messages`` one by one, longest first (LPT), each with ``job_id``, its
        cost and the order (property ``rmqtrace_order``, which the report's job view shows).

        A demand-driven fleet takes messages in the order the broker hands them out. On a normal
        topic that is only roughly the order sent: the broker spreads a job over the topic's
        queues and each receive starts at a queue of its choosing. ``priority_levels``, the queue
        count of a PRIORITY topic (RocketMQ 5.5, ``message.type=PRIORITY``), gives each message
        a priority falling with the send order (:func:`~tracer.dispatch.cost.job_priorities`),
        and the broker then hands the job out in exactly that order (docs/dispatch.md).
        ``cost``: a function of the message, or a :class:`CostTable` read by ``key(message)``
        (default: the message's first key). ``order="arrival"`` sends them as given (a
        baseline), still recording the order. Returns the receipts, in send order.

        Raises:
            ValueError: an unknown ``order``, a blank ``job_id``; a junk cost (NaN, negative, too
                large, not a number), a junk ``key=`` answer, or a raising ``cost``/``key``, naming
                the message; ``priority_levels`` below 1, or a message that cannot carry a
                priority (a message group, a delivery time), named; nothing is sent then.
            TypeError: ``cost`` is neither a function nor a table; ``job_id`` not a str;
                ``priority_levels`` not an int.
            JobSendError: a send raised (its ``__cause__``): ``.sent`` (with the receipts),
                ``.failed`` and ``.unsent`` say what went and what did not.
        """
        job_id = check_job_id(job_id)
        check_priority_levels(priority_levels)
        pairs = ordered_job(messages, cost, order, key)
        check_markable(messages, key)
        levels = iter(plan_priorities(messages, pairs, priority_levels, key) or ())

        def mark(m: Any) -> None:
            _setter(m)(JOB_ORDER_PROPERTY, order)
            if priority_levels is not None:
                m.priority = next(levels)  # at its own send: a failed job leaves the rest untouched

        return send_ordered(pairs, order, job_id, lambda m, c: self.send(m, job_id=job_id, cost=c), mark,
                            None if priority_levels is None else clear_priority)

    def send(self, message: Any, *args: Any, job_id: str | None = None, cost: float | None = None,
             **kwargs: Any) -> Any:
        return traced_send(self._tracer, self._producer.send, message, *args, job_id=job_id, cost=cost, **kwargs)

    def send_async(self, message: Any, *args: Any, job_id: str | None = None, cost: float | None = None,
                   **kwargs: Any) -> Future[Any]:
        return traced_send_async(self._tracer, self._producer.send_async, message, *args,
                                 job_id=job_id, cost=cost, **kwargs)
