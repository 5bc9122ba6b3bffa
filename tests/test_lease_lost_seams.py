"""Review #31 findings 3, 5 and 6: a lost lease is counted, and the message that ran twice shows
both runs, linked and kept together, on every seam that can see the loss.

- A settle the broker refuses because the lease was already gone (40013, "receipt handle is
  expired": :mod:`tracer.clients.refusal`) left the delivery unmeasured on ``TracedSimpleConsumer``
  and the instrumentor (the refusal raised before the trace ended; it was later forgotten
  unfinished): no count, no histogram entry, no span, no lost-lease count. ``ConsumeLoop``, which
  counted the loss it found itself, counted a refusal as an ack error only.
- A lease lost between the handler's end and the ack, under a keep policy: the first run was
  dropped at its finish, so the redelivery was neither linked nor kept — the message ran twice and
  neither run was exported.
- After a lost lease, the copy the loop refuses to start (the first run still runs) used up the
  remembered run, so the real second run got no link; under a keep policy neither was exported.

The seams are those that settle through the user's calls or the loop's: ``ConsumeLoop``,
``TracedSimpleConsumer`` and the instrumentor. The push seams (``TracedListener``, the 2.x
callback) are not among them: their client settles from the callback's result and renews by
itself, so no refusal reaches rmqtrace there.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
from manual_clock import Clock
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased
from prometheus_client import CollectorRegistry
from waiting import wait_until

from tracer.clients.consume import ConsumeLoop
from tracer.embedded import INVALID_RECEIPT_HANDLE, EmbeddedBroker, EmbeddedBrokerError, Message, Producer, SimpleConsumer
from tracer.path import names as n
from tracer.telemetry.hold import HoldingSpanProcessor
from tracer.telemetry.keep import KeepPolicy
from tracer.telemetry.metrics import TracerMetrics
from tracer.telemetry.tracer import MessageTracer

LABELS = {"topic": "T", "consumer_group": "G"}


class Rig:
    """Embedded broker on a manual clock (``clock``), one message ``A``; spans in memory, head-sampled
    or (``keep``) all dropped by the head and judged by a keep policy."""

    def __init__(self, keep: bool, consumer_class: type[SimpleConsumer] = SimpleConsumer) -> None:
        self.clock = Clock()
        self.broker = EmbeddedBroker(min_receive_invisible=1, monotonic=self.clock)
        self.broker.create_topic("T")
        producer = Producer(self.broker, ["T"])
        producer.startup()
        m = Message()
        m.topic, m.body = "T", b"A"
        producer.send(m)
        self.consumer = consumer_class(self.broker, "G", {"T": None}, await_duration=0)
        self.consumer.startup()
        self.exporter = InMemorySpanExporter()
        self.registry = CollectorRegistry()
        self.keep = KeepPolicy() if keep else None
        if keep:
            self.provider = TracerProvider(sampler=ParentBased(ALWAYS_OFF))
            self.hold: HoldingSpanProcessor | None = HoldingSpanProcessor([SimpleSpanProcessor(self.exporter)],
                                                                          ticker=False)
            self.provider.add_span_processor(self.hold)
        else:
            self.provider, self.hold = TracerProvider(), None
            self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.metrics = TracerMetrics(self.registry)
        self.cleanups: list[Callable[[], object]] = []

    def tracer(self) -> MessageTracer:
        return MessageTracer(consumer_group="G", tracer_provider=self.provider, metrics=self.metrics,
                             keep=self.keep, hold=self.hold)

    def value(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, {**LABELS, **labels}) or 0.0

    def processes(self) -> dict[int, ReadableSpan]:
        """Exported process spans by delivery attempt."""
        return {int(s.attributes["rmqtrace.delivery_attempt"]): s for s in self.exporter.get_finished_spans()
                if s.name == "process T"}


class _Refusing(SimpleConsumer):
    """A consumer whose broker finds every lease gone at the settle: what the proxy answers an
    ack or nack sent after the receipt handle's invisible time (code 40013)."""

    def ack(self, message: Any) -> None:
        raise EmbeddedBrokerError("receipt handle is expired", INVALID_RECEIPT_HANDLE)

    def change_invisible_duration(self, message: Any, invisible_duration: int) -> None:
        raise EmbeddedBrokerError("receipt handle is expired", INVALID_RECEIPT_HANDLE)


# -- the seams: each receives A, runs a handler (failing with `fail`), settles it ------------------
Settle = Callable[[Rig, bool], None]


def _wrapper_calls(rig: Rig, tracer: MessageTracer) -> tuple[Any, Any, Any]:
    from tracer.clients.official import TracedSimpleConsumer

    c = TracedSimpleConsumer(rig.consumer, tracer)
    return (lambda: c.receive(1, 1)), c.ack, (lambda m: c.change_invisible_duration(m, 1))


def _instrumentor_calls(rig: Rig, tracer: MessageTracer) -> tuple[Any, Any, Any]:
    from tracer.clients.instrumentor import RocketMQInstrumentor

    pytest.importorskip("rocketmq")
    inst = RocketMQInstrumentor()
    inst.instrument(tracer_provider=rig.provider, metrics=rig.metrics)
    rig.cleanups.append(inst.uninstrument)
    raw = rig.consumer
    seam = inst._seam_for(raw, "G")  # noqa: SLF001 - its tracer, for the keep policy of this rig
    seam.traces.tracer.keep, seam.traces.tracer.hold = rig.keep, rig.hold
    if rig.keep is not None and rig.hold is not None:
        rig.hold.attach(rig.keep)
    return ((lambda: inst._receive(raw.receive, raw, (1, 1), {})),  # noqa: SLF001 - the patched wrappers
            (lambda m: inst._ack(raw.ack, raw, (m,), {})),  # noqa: SLF001
            (lambda m: inst._change_invisible(raw.change_invisible_duration, raw, (m, 1), {})))  # noqa: SLF001


def _run_once(rig: Rig, calls: tuple[Any, Any, Any], fail: bool, *, stall: float = 0.0) -> int:
    """Receive one message, handle it (no processing() scope: receive to settle is the handler),
    settle it after ``stall`` seconds; the settle's refusal passes through. Its delivery attempt."""
    receive, ack, nack = calls
    (msg,) = receive()
    rig.clock.advance(stall)
    try:
        (nack if fail else ack)(msg)
    except EmbeddedBrokerError as exc:
        assert exc.code == INVALID_RECEIPT_HANDLE
    return int(msg.delivery_attempt)


def _loop(rig: Rig, fail: bool) -> ConsumeLoop:
    def handler(_msg: Any) -> None:
        if fail:
            raise ValueError("the handler failed")

    loop = ConsumeLoop(rig.consumer, handler, monotonic=rig.clock, workers=1, tracer=rig.tracer(),
                       invisible_duration=2, retry_backoff=lambda attempt: 1)
    rig.cleanups.append(lambda: loop.dispatcher.close(timeout=5))
    return loop


def _loop_once(loop: ConsumeLoop, rig: Rig, *, stall: float = 0.0) -> None:
    before = loop.statistics().reported
    assert loop.poll() == 1
    wait_until(lambda: loop.statistics().reported == before + 1, what="the handler reported")
    rig.clock.advance(stall)  # a stall before the settle: the lease may run out
    loop.settle_ready()


SEAMS = ["ConsumeLoop", "TracedSimpleConsumer", "instrumentor"]


@pytest.fixture
def cleanups() -> Any:
    done: list[Callable[[], object]] = []
    yield done
    for fn in done:
        fn()


@pytest.mark.parametrize("fail", [False, True], ids=["ack", "nack"])
@pytest.mark.parametrize("seam", SEAMS)
def test_a_settle_refused_for_a_lost_lease_is_measured_once_and_counted(seam: str, fail: bool, cleanups) -> None:
    rig = Rig(False, _Refusing)
    rig.cleanups = cleanups
    if seam == "ConsumeLoop":
        loop = _loop(rig, fail)
        _loop_once(loop, rig)
    else:
        make = _wrapper_calls if seam == "TracedSimpleConsumer" else _instrumentor_calls
        _run_once(rig, make(rig, rig.tracer()), fail)
    outcome = "failure" if fail else "success"
    # fails before (wrappers): nothing at all — the refusal raised before the trace ended
    assert rig.value("rmqtrace_messages_total", outcome=outcome) == 1
    assert rig.value("rmqtrace_messages_total", outcome="failure" if not fail else "success") == 0
    assert rig.value("rmqtrace_stage_duration_seconds_count", stage="handler") == 1
    # fails before (every seam): the loss was not counted (the loop: an ack error only)
    assert rig.value("rmqtrace_consumer_leases_lost_total", reason="expired") == 1
    [process] = rig.processes().values()
    assert process.attributes["rmqtrace.outcome"] == outcome
    if seam != "ConsumeLoop":  # the loop finishes at the handler's end, before its settle: not marked
        assert process.attributes[n.LEASE_LOST] == "expired"


@pytest.mark.parametrize("keep", [False, True], ids=["head-sampled", "keep-policy"])
@pytest.mark.parametrize("seam", SEAMS)
def test_a_message_that_ran_twice_after_a_lost_lease_shows_both_runs_linked(seam: str, keep: bool, cleanups) -> None:
    """The lease runs out between the handler's end and the settle (a stall); the broker hands
    the message out again and it runs again. Both runs exported, the second linked to the first,
    the loss counted once."""
    rig = Rig(keep)
    rig.cleanups = cleanups
    if seam == "ConsumeLoop":
        loop = _loop(rig, False)
        _loop_once(loop, rig, stall=5.0)
        assert loop.statistics().expired == 1
        rig.clock.advance(1.0)
        _loop_once(loop, rig)
        assert loop.statistics().acked == 1
    else:
        calls = (_wrapper_calls if seam == "TracedSimpleConsumer" else _instrumentor_calls)(rig, rig.tracer())
        assert _run_once(rig, calls, False, stall=5.0) == 1  # the ack is refused: lease gone
        assert _run_once(rig, calls, False) == 2
    assert rig.value("rmqtrace_consumer_leases_lost_total", reason="expired") == 1
    assert rig.value("rmqtrace_messages_total", outcome="success") == 2
    procs = rig.processes()
    # fails before: keep-policy (ConsumeLoop) exports neither run; the wrappers nothing at all
    assert sorted(procs) == [1, 2], sorted(procs)
    linked = [link.context.span_id for link in procs[2].links
              if link.attributes and link.attributes.get(n.LINK_REASON) == n.LINK_LEASE_LOST]
    assert linked == [procs[1].context.span_id]
    if rig.keep is not None:
        assert rig.keep.statistics().by_reason["lease_lost"] == 2


@pytest.mark.parametrize("keep", [False, True], ids=["head-sampled", "keep-policy"])
def test_the_copy_refused_beside_a_hung_run_leaves_the_link_to_the_real_second_run(keep: bool) -> None:
    """ConsumeLoop only (the one seam with a start gate): attempt 1 hangs and loses its lease;
    attempt 2 comes while it runs and is refused (not_started); attempt 3 really runs again. It,
    not the refused copy, links to attempt 1 and is kept with it."""
    import threading

    rig = Rig(keep)
    go = threading.Event()
    runs: list[int] = []

    def handler(m: Any) -> None:
        runs.append(m.delivery_attempt)
        if m.delivery_attempt == 1:
            go.wait(10)

    loop = ConsumeLoop(rig.consumer, handler, monotonic=rig.clock, workers=2, tracer=rig.tracer(),
                       invisible_duration=2, retry_backoff=lambda attempt: 1)
    try:
        assert loop.poll() == 1
        wait_until(lambda: runs == [1], what="attempt 1 running")
        rig.clock.advance(10)  # a stall past the lease
        loop.renew_leases()
        assert loop.statistics().leases_lost == 1
        assert loop.poll() == 1  # attempt 2, beside the hung attempt 1
        wait_until(lambda: loop.statistics().not_started == 1, what="attempt 2 refused")
        loop.settle_ready()
        go.set()
        wait_until(lambda: loop.statistics().succeeded == 1, what="attempt 1 returned")
        loop.settle_ready()
        rig.clock.advance(5)
        assert loop.poll() == 1  # attempt 3: the real second run
        wait_until(lambda: loop.statistics().succeeded == 2, what="attempt 3 reported")
        loop.settle_ready()
    finally:
        go.set()
        loop.dispatcher.close(timeout=5)
    procs = rig.processes()
    lost_links = {a: [link.context.span_id for link in s.links
                      if link.attributes and link.attributes.get(n.LINK_REASON) == n.LINK_LEASE_LOST]
                  for a, s in procs.items()}
    # fails before: attempt 2 took the link (attempt 3: []); under keep attempt 3 was not exported
    assert 3 in procs and lost_links[3] == [procs[1].context.span_id], lost_links
    assert not lost_links.get(2)
    assert sorted(procs) == ([1, 3] if keep else [1, 2, 3])  # the refused copy: dropped as not_handled


def test_a_renewal_refused_inside_processing_is_a_lost_lease_and_the_trace_stays_open() -> None:
    """``TracedSimpleConsumer.renew_lease``: said to be a renewal, it never ends the trace; refused
    because the lease was gone, the loss is counted once and the run marked, kept and remembered."""
    from tracer.clients.official import TracedSimpleConsumer

    rig = Rig(True, _Refusing)
    c = TracedSimpleConsumer(rig.consumer, rig.tracer())
    (msg,) = c.receive(1, 1)
    with c.processing(msg):
        with pytest.raises(EmbeddedBrokerError):
            c.renew_lease(msg, 5)
        assert rig.value("rmqtrace_consumer_leases_lost_total", reason="expired") == 1
    assert not rig.processes()  # a renewal: the trace waits for the settle
    with pytest.raises(EmbeddedBrokerError):
        c.ack(msg)
    assert rig.value("rmqtrace_consumer_leases_lost_total", reason="expired") == 1  # once per delivery
    assert rig.value("rmqtrace_messages_total", outcome="success") == 1
    [process] = rig.processes().values()
    assert process.attributes[n.LEASE_LOST] == "expired"
    assert rig.keep is not None and rig.keep.statistics().by_reason["lease_lost"] == 1


def _refusing_async_consumer() -> Any:
    """Every settle call of the client (the async ones too) refused on the spot: lease gone."""
    from test_failed_deliveries import _consumer

    raw = _consumer()

    def refuse(*_args: Any) -> None:
        raise EmbeddedBrokerError("receipt handle is expired", INVALID_RECEIPT_HANDLE)

    for name in ("ack", "ack_async", "change_invisible_duration", "change_invisible_duration_async"):
        setattr(raw, name, refuse)
    return raw


def _settle_calls() -> list[str]:
    pytest.importorskip("rocketmq")
    from test_failed_deliveries import _settle_calls as calls

    return calls()


@pytest.mark.parametrize("seam", ["TracedSimpleConsumer", "instrumentor"])
@pytest.mark.parametrize("call", _settle_calls())
def test_every_settle_call_refused_on_the_spot_is_measured_once_and_a_lost_lease(seam: str, call: str, spans) -> None:
    """Every settle call of the 5.x ``SimpleConsumer`` (discovered from the client's class), on
    both wrappers: a refusal raised by the call ends the trace with the call's outcome and counts
    the lost lease (the async calls' later refusals, in a future nobody can wait for, are not seen)."""
    from test_failed_deliveries import _through_instrumentor, _through_wrapper

    provider, memory = spans
    reg = CollectorRegistry()
    receive, settle, cleanup = (_through_wrapper if seam == "TracedSimpleConsumer" else _through_instrumentor)(
        _refusing_async_consumer(), provider, reg, call)
    try:
        (msg,) = receive()
        for _ in range(2):  # twice: still one measurement
            with pytest.raises(EmbeddedBrokerError):
                settle(msg)
    finally:
        cleanup()
    outcome = "failure" if call.startswith("change_invisible_duration") else "success"
    value = reg.get_sample_value
    assert value("rmqtrace_messages_total", {**LABELS, "outcome": outcome}) == 1
    assert value("rmqtrace_consumer_leases_lost_total", {**LABELS, "reason": "expired"}) == 1
    [process] = [s for s in memory.get_finished_spans() if s.name == "process T"]
    assert process.attributes[n.LEASE_LOST] == "expired"
