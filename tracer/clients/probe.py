"""Probes: a live canary for the wait inside consumers, useful even at zero traffic.

A :class:`ProbeSender` sends a small message marked with the ``rmqtrace_probe`` property
(:data:`tracer.path.names.PROBE_PROPERTY`) every ``interval`` seconds. Every rmqtrace seam — the
consume loop, the 5.x traced listener, the 2.x callback wrapper, the instrumentor's push consumers —
recognises it where the user's handler would start, calls :func:`settle_probe`, acks it and never
hands it to the handler. The probe's gaps go to the ``rmqtrace_probe_*`` series
(:mod:`tracer.telemetry.probe_metrics`), not to the real messages' ones, and it writes no spans.

What a probe measures: the time a message sent now spends before a handler would start on it —
in the broker, in the client's cache, in the dispatcher's queue — with whatever the consumer is
doing at the moment. What it does not: the handler's own time (it runs none), nor what a handler
would do to the workers (a probe frees its slot at once).

A ``SimpleConsumer`` the user drives (:class:`~tracer.clients.official.TracedSimpleConsumer`, the
instrumentor's patched ``receive``) gets its probes taken out of ``receive``'s result
(:func:`tracer.clients.official.settle_received`), acked on the spot.

The consume loop's dispatcher stamps and finishes its own trace object, so there a probe rides
the dispatcher as a :class:`ProbeTrace` (built by :func:`probe_stage`) whose finish is
:func:`settle_probe`, and :func:`skip_probes` keeps it from the handler; the probe waits for a
slot like any message, which is what makes its ``dispatch_wait`` true.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import abc
from typing import Any, Callable, TypeVar

from ..path.clock import WallClock, default_clock, require_clock
from ..path.names import PROBE_PROPERTY, PROBE_VALUE, PRODUCE_NS_PROPERTY
from ..path.stages import Outcome, Stage
from ..path.stamps import MISSING
from ..telemetry.probe_metrics import ProbeMetrics
from ..telemetry.tracer import MessageTrace, MessageTracer

__all__ = ["PROBE_BODY", "PROBE_PROPERTY", "ProbeSender", "ProbeTrace", "is_probe", "probe_stage", "settle_probe",
           "skip_probes"]

log = logging.getLogger(__name__)

PROBE_BODY = b"rmqtrace probe"
_R = TypeVar("_R")


def is_probe(source: Any) -> bool:
    """Whether ``source`` — a message (5.x, embedded, 2.x with ``get_property``), a
    :class:`~tracer.path.message.MessageInfo` or a properties mapping — carries the probe marker:
    the property with exactly the value the probe sender writes (``"1"``; a 2.x client may hand
    it back as bytes). Never raises: anything unreadable is not a probe."""
    # On every message's path: a plain dict (what describe() and the 5.x client hold) is read
    # without an ABC check, which costs ten times the lookup (typing.Mapping's more still).
    if type(source) is dict:
        return _marks(source.get(PROBE_PROPERTY))
    try:
        props = getattr(source, "properties", None)
        if type(props) is dict:
            return _marks(props.get(PROBE_PROPERTY))
        if isinstance(source, abc.Mapping):
            props = source
        if isinstance(props, abc.Mapping):
            return _marks(props.get(PROBE_PROPERTY))
        get = getattr(source, "get_property", None)
        return _marks(get(PROBE_PROPERTY)) if get is not None else False
    except Exception:  # noqa: BLE001 - a foreign message object
        return False


_PROBE_BYTES = PROBE_VALUE.encode()


def _marks(value: object) -> bool:
    # exact match only: a user message carrying the property with any other value is not acked unrun
    return value == PROBE_VALUE or value == _PROBE_BYTES


def _metrics_for(tracer: MessageTracer, metrics: ProbeMetrics | None) -> ProbeMetrics | None:
    if metrics is not None:
        return metrics
    # The probe series live beside the tracer's own: no tracer metrics, no probe metrics either.
    return ProbeMetrics.shared(tracer.metrics.registry) if tracer.metrics is not None else None


def settle_probe(tracer: MessageTracer | None, trace: MessageTrace | None, *,
                 metrics: ProbeMetrics | None = None) -> bool:
    """The one pre-handler step of every seam: True when ``trace`` is a probe's, which is then
    settled — stamped up to the handler's start (now), its gaps recorded in the probe series
    (``metrics``, else :meth:`ProbeMetrics.shared` on the tracer's registry) — and the seam must
    ack it as a success without calling the handler, and without finishing ``trace``.

    False for any other message (one dictionary lookup) and when there is no trace. Never raises.
    """
    if tracer is None or trace is None or not is_probe(trace.info.properties):
        return False
    try:
        times = trace.stamps.times
        now = trace.now()
        if times[Stage.DISPATCH_ENQUEUE] == MISSING:
            times[Stage.DISPATCH_ENQUEUE] = times[Stage.CLIENT_PULL]
        if times[Stage.HANDLER_START] == MISSING:
            times[Stage.HANDLER_START] = now
        times[Stage.HANDLER_END] = times[Stage.HANDLER_START]  # no handler runs
        if tracer.occupancy is not None:
            tracer.occupancy.discarded(trace.anchor.mono_ns)  # received, never took a worker
        m = _metrics_for(tracer, metrics)
        if m is not None:
            m.record(trace.info.topic, tracer.consumer_group, times, now)
    except Exception as exc:  # noqa: BLE001 - still a probe: the handler must not get it
        tracer.hook_failed("settling a probe", exc)
    return True


class ProbeTrace:
    """A probe's trace as the dispatcher sees it (``MessageTraceLike``): the dispatcher's stamps go
    into the message's own stamps, the handler scope opens no spans, and finish is
    :func:`settle_probe`. Built by :func:`probe_stage`."""

    __slots__ = ("tracer", "trace", "metrics", "worker")

    def __init__(self, tracer: MessageTracer, trace: MessageTrace, metrics: ProbeMetrics | None = None) -> None:
        self.tracer = tracer
        self.trace = trace
        self.metrics = metrics
        self.worker: int | None = None

    def mark(self, stage: Stage) -> None:
        self.trace.mark(stage)

    def handler_scope(self) -> ProbeTrace:
        return self

    def __enter__(self) -> None:
        self.trace.mark(Stage.HANDLER_START)

    def __exit__(self, *exc: object) -> None:
        return None

    def finish(self, outcome: Outcome, error: BaseException | None) -> None:
        settle_probe(self.tracer, self.trace, metrics=self.metrics)


def probe_stage(tracer: MessageTracer | None, trace: MessageTrace | None,
                metrics: ProbeMetrics | None = None) -> MessageTrace | ProbeTrace | None:
    """What a dispatcher should carry for this message: a :class:`ProbeTrace` for a probe's
    trace, ``trace`` itself for every other message."""
    if tracer is not None and trace is not None and is_probe(trace.info.properties):
        return ProbeTrace(tracer, trace, metrics)
    return trace


def skip_probes(handler: Callable[[Any], _R]) -> Callable[[Any], _R | None]:
    """``handler`` for every message but probes, which return None (success) without calling it."""

    def run(message: Any) -> _R | None:
        if is_probe(message):
            return None
        return handler(message)

    run.__wrapped__ = handler  # type: ignore[attr-defined]
    return run


class ProbeSender:
    """Sends a probe to ``topic`` through ``producer`` every ``interval`` seconds.

    ``producer``: a started 5.x ``Producer``, an embedded one, or anything with ``send(message)``;
    ``message_factory``: its client's ``Message`` class (5.x ``rocketmq.Message``, or
    :class:`tracer.embedded.Message`). ``tag``: set one when the consumers filter by tag, so the
    probe matches their subscription. The produce stamp is taken with ``clock`` (wall-clock ns);
    the schedule with ``monotonic`` and ``sleep`` (seconds), so tests drive it without waiting.
    A failed send is counted (``rmqtrace_probe_sent_total{outcome="failure"}``), logged once, and
    the next one is tried on schedule.

    Raises:
        ValueError: ``interval`` is not a number > 0, or ``topic`` is empty.
    """

    def __init__(self, producer: Any, topic: str, message_factory: Callable[[], Any], *, interval: float = 10.0,
                 tag: str | None = None, metrics: ProbeMetrics | None = None, clock: WallClock | None = None,
                 monotonic: Callable[[], float] = time.monotonic, sleep: Callable[[float], object] | None = None) -> None:
        if not isinstance(interval, (int, float)) or not interval > 0 or interval != interval or interval == float("inf"):
            raise ValueError(f"interval must be a number of seconds > 0, got {interval!r}")
        if not topic:
            raise ValueError("topic must be a non-empty topic name")
        self.producer = producer
        self.topic = topic
        self.interval = float(interval)
        self.tag = tag
        self.metrics = metrics
        self._factory = message_factory
        if clock is not None:
            require_clock(clock, "ProbeSender(clock=)", wall=True)
        self._clock: WallClock = clock or default_clock()
        self._monotonic = monotonic
        self._stop = threading.Event()
        self._sleep = sleep or self._stop.wait
        self.sent = 0
        self.failed = 0
        self._warned = False

    def message(self) -> Any:
        """A new probe message, stamped now."""
        msg = self._factory()
        msg.topic = self.topic
        msg.body = PROBE_BODY
        if self.tag:
            msg.tag = self.tag
        msg.keys = "rmqtrace-probe"
        msg.add_property(PROBE_PROPERTY, PROBE_VALUE)
        msg.add_property(PRODUCE_NS_PROPERTY, str(self._clock.wall_ns()))
        return msg

    def send_one(self, *, check: bool = False) -> bool:
        """Send one probe now; whether the broker took it. ``check``: a failure (still counted)
        raises the client's exception instead of being logged."""
        msg = self.message()
        try:
            self.producer.send(msg)
        except Exception as exc:  # noqa: BLE001 - a broker hiccup must not end the probe
            self.failed += 1
            if check:
                if self.metrics is not None:
                    self.metrics.sent_one(self.topic, False, self._clock.wall_ns())
                raise
            if not self._warned:
                self._warned = True
                log.warning("rmqtrace probe: sending to %r failed (%s); further failures are counted", self.topic, exc)
            if self.metrics is not None:
                self.metrics.sent_one(self.topic, False, self._clock.wall_ns())
            return False
        self.sent += 1
        if self.metrics is not None:
            self.metrics.sent_one(self.topic, True, self._clock.wall_ns())
        return True

    def run(self, count: int | None = None, *, check_first: bool = False) -> int:
        """Send ``count`` probes (None: until :meth:`stop`), one per ``interval`` on a fixed
        schedule (a slow send does not push the later ones back); returns how many were sent.
        ``check_first``: the first send's failure raises (a wrong endpoint or topic shows at once).

        Raises:
            ValueError: ``count`` is below 1.
        """
        if count is not None and count < 1:
            raise ValueError(f"count must be >= 1 (or None: until stop()), got {count}")
        start = self._monotonic()
        k = 0  # probes since `start`: the schedule
        tried = 0
        while not self._stop.is_set():
            self.send_one(check=check_first and tried == 0)
            k += 1
            tried += 1
            if count is not None and tried >= count:
                break
            delay = start + k * self.interval - self._monotonic()
            if delay < 0:  # fell behind (a send took longer than the interval): restart the schedule
                start, k = self._monotonic(), 0
                delay = 0.0
            self._sleep(delay)
        return self.sent

    def stop(self) -> None:
        """End :meth:`run` after the current send (safe from a signal handler)."""
        self._stop.set()
