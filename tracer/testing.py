"""Test your own handler without a broker: an embedded broker, a traced producer and a consume loop.

    from tracer.testing import traced_pipeline

    def test_my_handler_runs_every_message():
        with traced_pipeline(my_handler, workers=2) as pipe:
            for i in range(10):
                pipe.send(b'{"cases": 3}', keys=f"tg-{i}")
            done = pipe.wait(10)                  # the first 10 finished deliveries
        assert all(d.outcome == "success" for d in done)
        print(max(d.gaps["consumer_wait"] for d in done))   # waited inside the consumer, seconds

Your handler gets the embedded broker's message (the attribute names of ``rocketmq.Message``:
``body``, ``topic``, ``tag``, ``keys``, ``properties``, ``message_id``); it runs under the same
:class:`~tracer.ConsumeLoop`, dispatcher and :class:`~tracer.MessageTracer` as in production, so
every stage is stamped and its gaps, spans (in memory) and histograms (a fresh registry) can be
read back. As a pytest fixture::

    @pytest.fixture
    def pipe():
        with traced_pipeline(my_handler) as p:
            yield p

A handler that raises is a failed delivery: the message comes back after the loop's retry backoff
(``retry_backoff=``, 1 s first by default) with ``attempt`` + 1, as from a real broker. The failed
:class:`Delivery` carries the exception's type and message (``error_type``, ``error_message``), the
failure is printed to stderr as it happens (pytest shows it under "Captured stderr" of the failing
test, fixture form included), and a :meth:`Pipeline.wait` that times out names the failed deliveries.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from .callables import never_ran, require_plain
from .clients.consume import ConsumeLoop
from .clients.producer import TracedProducer
from .dispatch import DispatchMetrics
from .embedded import EmbeddedBroker, FilterExpression, Message, Producer, SimpleConsumer
from .path.stages import Outcome
from .path.stamps import compute_gaps
from .telemetry.metrics import TracerMetrics
from .telemetry.tracer import MessageTrace, MessageTracer

__all__ = ["Delivery", "Pipeline", "traced_pipeline"]


@dataclass(frozen=True)
class Delivery:
    """One finished delivery of one message, as the tracer saw it."""

    message_id: str
    keys: tuple[str, ...]
    attempt: int
    outcome: str  # "success", "failure", "timeout", "skipped" (:class:`~tracer.Outcome` values)
    gaps: dict[str, float] = field(default_factory=dict)  # seconds per gap name, e.g. "consumer_wait"
    error_type: str | None = None  # the exception's class, e.g. "AssertionError"; None when it succeeded
    error_message: str | None = None  # str() of the exception ("" when it had no text)

    def describe(self) -> str:
        """One line: which delivery, and why it failed (its outcome when it did not)."""
        keys = f" (keys {', '.join(self.keys)})" if self.keys else ""
        what = f"{self.message_id or '?'}{keys} attempt {self.attempt}"
        if self.error_type is None:
            return f"{what}: {self.outcome}"
        return f"{what}: {self.outcome}: {self.error_type}: {self.error_message}"


class Pipeline:
    """What :func:`traced_pipeline` yields: send messages, wait for them, read their gaps."""

    def __init__(self, broker: EmbeddedBroker, topic: str, producer: TracedProducer, loop: ConsumeLoop,
                 registry: CollectorRegistry, exporter: InMemorySpanExporter,
                 errors: _Errors | None = None, handler_timeout: float | None = None) -> None:
        self.broker = broker
        self.topic = topic
        self.producer = producer
        self.loop = loop
        self.registry = registry  # every rmqtrace histogram and counter of this pipeline
        self._exporter = exporter
        self._done: list[Delivery] = []
        self._cond = threading.Condition()
        self._errors = errors if errors is not None else _Errors()
        self._handler_timeout = handler_timeout

    def send(self, body: bytes | str, *, tag: str | None = None, keys: str | None = None,
             properties: dict[str, str] | None = None, job_id: str | None = None,
             cost: float | None = None) -> str:
        """Send one message through the traced producer; returns its message id."""
        msg = Message()
        msg.topic = self.topic
        msg.body = body.encode() if isinstance(body, str) else bytes(body)
        msg.tag = tag
        if keys is not None:
            msg.keys = keys
        for k, v in (properties or {}).items():
            msg.add_property(k, v)
        receipt = self.producer.send(msg, job_id=job_id, cost=cost)
        return str(getattr(receipt, "message_id", receipt))

    def wait(self, n: int, timeout: float = 10.0) -> list[Delivery]:
        """The first ``n`` finished deliveries, waiting up to ``timeout`` seconds for them.

        Raises:
            TimeoutError: fewer than ``n`` finished in time (the message says how many did, and
                which of them failed and why).
        """
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._done) >= n, timeout):
                failed = [d for d in self._done if d.outcome != Outcome.SUCCESS.value]
                why = f"; {len(failed)} failed: " + "; ".join(d.describe() for d in failed[-5:]) if failed else ""
                raise TimeoutError(f"{len(self._done)} of {n} deliveries finished within {timeout:g} s{why}")
            return list(self._done[:n])

    @property
    def failures(self) -> list[Delivery]:
        """Every delivery finished so far that did not succeed, in order, each with its reason."""
        with self._cond:
            return [d for d in self._done if d.outcome != Outcome.SUCCESS.value]

    @property
    def deliveries(self) -> list[Delivery]:
        """Every delivery finished so far, in the order they finished."""
        with self._cond:
            return list(self._done)

    def spans(self) -> tuple[ReadableSpan, ...]:
        """The finished spans: ``send {topic}``, ``process {topic}`` and its gap children."""
        return self._exporter.get_finished_spans()

    def metric(self, name: str, **labels: str) -> float | None:
        """One sample of the pipeline's registry, e.g. ``metric("rmqtrace_messages_total", outcome="success",
        topic=..., consumer_group=...)``; None when there is no such sample."""
        return self.registry.get_sample_value(name, labels)

    def _finished(self, trace: MessageTrace, outcome: Outcome) -> None:
        info = trace.info
        message_id, attempt = str(info.message_id or ""), info.delivery_attempt or 1
        error = self._errors.pop(message_id, attempt)
        error_type = error_message = None
        if outcome is Outcome.TIMEOUT:
            limit = f"={self._handler_timeout:g} s" if self._handler_timeout is not None else ""
            error_type, error_message = "HandlerTimeout", f"the handler ran longer than handler_timeout{limit}"
        elif error is not None:
            error_type, error_message = type(error).__qualname__, str(error)
        elif outcome is not Outcome.SUCCESS:
            error_type, error_message = outcome.value, "the loop reported it without an exception from the handler"
        d = Delivery(message_id, tuple(info.keys), attempt, outcome.value,
                     {g.gap.name: g.seconds for g in compute_gaps(trace.stamps)}, error_type, error_message)
        if error_type is not None:
            print(f"rmqtrace.testing: delivery {d.describe()}", file=sys.stderr)
        with self._cond:
            self._done.append(d)
            self._cond.notify_all()


class _Errors:
    """The exception each delivery's handler raised, by (message id, attempt), until it is read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_delivery: dict[tuple[str, int], BaseException] = {}

    def wrap(self, handler: Callable[[Any], object]) -> Callable[[Any], object]:
        @functools.wraps(handler)
        def run(message: Any) -> object:
            try:
                result = handler(message)
                unrun = never_ran(result, "handler")  # raised here, so the delivery names it
                if unrun is not None:
                    raise unrun
                return result
            except BaseException as exc:
                key = (str(getattr(message, "message_id", "") or ""), getattr(message, "delivery_attempt", None) or 1)
                with self._lock:
                    self._by_delivery[key] = exc
                raise
        return run

    def pop(self, message_id: str, attempt: int) -> BaseException | None:
        with self._lock:
            return self._by_delivery.pop((message_id, attempt), None)


@contextmanager
def traced_pipeline(handler: Callable[[Any], object], *, topic: str = "test-topic", group: str = "test-consumers",
                    workers: int = 2, policy: Any = "aggressive", **loop_options: Any) -> Iterator[Pipeline]:
    """A running pipeline around ``handler``: embedded broker → traced producer → consume loop.

    ``policy``, ``workers`` and ``loop_options`` (``key=``, ``cost=``, ``handler_timeout=``,
    ``retry_backoff=`` …) go to :class:`~tracer.ConsumeLoop`. On exit the loop stops receiving,
    lets in-flight handlers finish, acks them and shuts the clients down.

    Raises:
        ValueError / TypeError: from :class:`~tracer.ConsumeLoop` for options that cannot work.
    """
    require_plain(handler, "handler")  # before anything starts; the wrapper below would hide its kind
    broker = EmbeddedBroker()
    broker.create_topic(topic)
    registry = CollectorRegistry()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    metrics = TracerMetrics(registry)
    consumer = SimpleConsumer(broker, group, {topic: FilterExpression()}, await_duration=0.05)
    producer = TracedProducer(Producer(broker, [topic]), MessageTracer(tracer_provider=provider))
    consumer.startup()
    producer.startup()
    tracer = MessageTracer(consumer_group=group, tracer_provider=provider, metrics=metrics)
    errors = _Errors()
    loop = ConsumeLoop(consumer, errors.wrap(handler), tracer=tracer, policy=policy, workers=workers,
                       dispatch_metrics=DispatchMetrics(registry), **loop_options)
    pipe = Pipeline(broker, topic, producer, loop, registry, exporter, errors, loop_options.get("handler_timeout"))
    tracer.listeners.append(pipe._finished)
    runner = threading.Thread(target=loop.run, name=f"rmqtrace-testing-{group}", daemon=True)
    runner.start()
    try:
        yield pipe
    finally:
        loop.stop()
        runner.join()
        consumer.shutdown()
        producer.shutdown()
        provider.shutdown()
