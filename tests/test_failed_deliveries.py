"""Issue 31 item 1 and its siblings: a delivery the user settles is measured once with its real
outcome on every path that sees the settle — each settle call of the 5.x ``SimpleConsumer``
(discovered from the client's class, so a new one shows up here) through ``TracedSimpleConsumer``
and through the instrumentor (``opentelemetry-instrument`` installs the same one), and each push
seam (5.x listener, 2.x callback: every :class:`~tracer.clients.listener.Seam` of the package)."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

import tracer.clients
from tracer.clients.listener import Seam, traced_consume
from tracer.embedded import EmbeddedBroker, Message, Producer, SimpleConsumer
from tracer.telemetry.metrics import TracerMetrics
from tracer.telemetry.tracer import MessageTracer

rocketmq = pytest.importorskip("rocketmq")
from rocketmq.v5.consumer import SimpleConsumer as ClientSimpleConsumer  # noqa: E402

_NACKS = ("change_invisible_duration",)  # the 5.x nack: a retry after the new invisible time
_ACKS = ("ack",)


def _settle_calls() -> list[str]:
    """Every public call of the client's SimpleConsumer that settles a received message."""
    names = sorted(n for n in vars(ClientSimpleConsumer) if not n.startswith("_") and callable(
        getattr(ClientSimpleConsumer, n)) and n.startswith(_ACKS + _NACKS))
    assert {"ack", "ack_async", "change_invisible_duration", "change_invisible_duration_async"} <= set(names)
    return names


class _AsyncEmbedded(SimpleConsumer):
    """The embedded consumer with the client's async settles (done at once; the client's return None)."""

    def ack_async(self, message: Message) -> Future[None]:
        self.ack(message)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def change_invisible_duration_async(self, message: Message, invisible_duration: int) -> Future[None]:
        self.change_invisible_duration(message, invisible_duration)
        done: Future[None] = Future()
        done.set_result(None)
        return done


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    yield provider, memory
    provider.shutdown()


def _consumer() -> _AsyncEmbedded:
    broker = EmbeddedBroker()
    producer = Producer(broker, ["T"])
    producer.startup()
    m = Message()
    m.topic, m.body = "T", b"x"
    producer.send(m)
    raw = _AsyncEmbedded(broker, "G", {"T": None}, await_duration=0)
    raw.startup()
    return raw


def _through_wrapper(raw: Any, provider: TracerProvider, reg: CollectorRegistry, call: str
                     ) -> tuple[Callable[[], Any], Callable[[Any], Any], Callable[[], None]]:
    from tracer.clients.official import TracedSimpleConsumer

    c = TracedSimpleConsumer(raw, MessageTracer(consumer_group="G", tracer_provider=provider,
                                                metrics=TracerMetrics(reg)))
    assert call in vars(TracedSimpleConsumer), f"TracedSimpleConsumer.{call} passes through untraced"
    settle = getattr(c, call)
    return (lambda: c.receive(1, 30)), (lambda msg: settle(msg, 10) if call.startswith(_NACKS) else settle(msg)), \
        (lambda: None)


def _through_instrumentor(raw: Any, provider: TracerProvider, reg: CollectorRegistry, call: str
                          ) -> tuple[Callable[[], Any], Callable[[Any], Any], Callable[[], None]]:
    import wrapt

    from tracer.clients.instrumentor import RocketMQInstrumentor

    inst = RocketMQInstrumentor()
    inst.instrument(tracer_provider=provider, registry=reg)
    try:
        patched = {n: vars(ClientSimpleConsumer)[n] for n in ("receive", call)}
        for name, fn in patched.items():
            assert isinstance(fn, wrapt.FunctionWrapper), f"the instrumentor leaves SimpleConsumer.{name} unwrapped"
    except BaseException:
        inst.uninstrument()
        raise
    # the patched methods' wrappers, called with the embedded consumer's own methods
    receive_w, settle_w = (patched[n]._self_wrapper for n in ("receive", call))
    own = getattr(raw, call)
    return ((lambda: receive_w(raw.receive, raw, (1, 30), {})),
            (lambda msg: settle_w(own, raw, (msg, 10) if call.startswith(_NACKS) else (msg,), {})),
            inst.uninstrument)


@pytest.mark.parametrize("seam", [_through_wrapper, _through_instrumentor], ids=["TracedSimpleConsumer", "instrumentor"])
@pytest.mark.parametrize("call", _settle_calls())
def test_every_settle_call_measures_the_delivery_once_with_its_outcome(spans, seam, call: str) -> None:
    provider, memory = spans
    reg = CollectorRegistry()
    receive, settle, cleanup = seam(_consumer(), provider, reg, call)
    try:
        (msg,) = receive()
        settle(msg)
        settle(msg)  # twice: still one measurement
    finally:
        cleanup()
    outcome = "failure" if call.startswith(_NACKS) else "success"
    labels = {"topic": "T", "consumer_group": "G"}
    counts = {o: reg.get_sample_value("rmqtrace_messages_total", {**labels, "outcome": o}) or 0
              for o in ("success", "failure")}
    assert counts == {o: int(o == outcome) for o in counts}
    assert reg.get_sample_value("rmqtrace_stage_duration_seconds_count", {**labels, "stage": "handler"}) == 1
    [process] = [s for s in memory.get_finished_spans() if s.name == "process T"]
    assert process.status.status_code.name == ("ERROR" if outcome == "failure" else "UNSET")


def _push_seams() -> list[tuple[str, Seam]]:
    found = []
    for mod in pkgutil.iter_modules(tracer.clients.__path__, "tracer.clients."):
        module = importlib.import_module(mod.name)
        found += [(f"{mod.name}.{k}", v) for k, v in vars(module).items() if isinstance(v, Seam)]
    assert len(found) >= 2, found  # the 5.x listener and the 2.x callback
    return sorted(found, key=lambda kv: kv[0])


class _Pushed:
    """A message as both push clients hand it over (5.x attribute names, 2.x ones)."""

    topic = "T"
    message_id = id = "M"
    properties: dict[str, str] = {}
    body = b"x"
    tags = keys = b""
    reconsume_times = queue_id = 0
    decode_message_timestamp = born_timestamp = store_timestamp = None

    def get_property(self, prop: str) -> bytes:
        return b""


class _FailResult:
    name = "FAILURE"  # ConsumeResult.FAILURE; as an int (2.x RECONSUME_LATER is 1) it is not success

    def __int__(self) -> int:
        return 1


@pytest.mark.parametrize("how", ["returned", "raised"])
@pytest.mark.parametrize(("name", "seam"), _push_seams(), ids=[n for n, _ in _push_seams()])
def test_every_push_seam_measures_a_failed_delivery_once_as_a_failure(spans, name: str, seam: Seam, how: str) -> None:
    provider, memory = spans
    reg = CollectorRegistry()
    tracer_ = MessageTracer(consumer_group="G", tracer_provider=provider, metrics=TracerMetrics(reg))
    assert not seam.succeeded(_FailResult())

    def callback(message: Any) -> Any:
        if how == "raised":
            raise KeyError("user bug")
        return _FailResult()

    if how == "raised":
        with pytest.raises(KeyError):
            traced_consume(tracer_, seam, callback, _Pushed())
    else:
        traced_consume(tracer_, seam, callback, _Pushed())
    labels = {"topic": "T", "consumer_group": "G"}
    assert reg.get_sample_value("rmqtrace_messages_total", {**labels, "outcome": "failure"}) == 1
    assert not reg.get_sample_value("rmqtrace_messages_total", {**labels, "outcome": "success"})
    assert reg.get_sample_value("rmqtrace_stage_duration_seconds_count", {**labels, "stage": "handler"}) == 1
    [process] = [s for s in memory.get_finished_spans() if s.name == "process T"]
    assert process.status.status_code.name == "ERROR"
