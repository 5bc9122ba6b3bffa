"""Issue 31 item 5: a lost lease and the duplicate run it causes are visible.

Before, ``leases_lost`` lived only in ``loop.statistics()``: both runs of a message whose lease
ran out exported as plain successes. Now the loss is counted (``rmqtrace_consumer_leases_lost_total``),
marked on the run's ``process`` span (``rmqtrace.lease.lost``), that trace is kept, and the
redelivery's ``process`` span links to the run whose lease was lost. Embedded broker, manual
clock shared with it (no sleeping for a lease), in-memory exporter, fresh registry.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from manual_clock import Clock
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from waiting import wait_until

from tracer.clients.consume import ConsumeLoop
from tracer.embedded import EmbeddedBroker, Message, Producer, SimpleConsumer
from tracer.path import names as n
from tracer.path.message import MessageInfo
from tracer.path.stages import Outcome
from tracer.telemetry.hold import HoldingSpanProcessor
from tracer.telemetry.keep import KeepPolicy
from tracer.telemetry.metrics import TracerMetrics
from tracer.telemetry.tracer import MessageTracer


class Rig:
    def __init__(self, keep: bool) -> None:
        self.clock = Clock()
        self.broker = EmbeddedBroker(min_receive_invisible=1, monotonic=self.clock)
        self.broker.create_topic("T")
        producer = Producer(self.broker, ["T"])
        producer.startup()
        m = Message()
        m.topic, m.body = "T", b"A1"
        producer.send(m)
        self.consumer = SimpleConsumer(self.broker, "G", {"T": None}, await_duration=0)
        self.consumer.startup()
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        hold = None
        policy = None
        if keep:
            # the head drops everything: only the keep policy can keep a trace
            from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
            self.provider = TracerProvider(sampler=ALWAYS_OFF)
            hold = HoldingSpanProcessor([SimpleSpanProcessor(self.exporter)], ticker=False)
            self.provider.add_span_processor(hold)
            policy = KeepPolicy()
        else:
            self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.registry = CollectorRegistry()
        self.tracer = MessageTracer(consumer_group="G", tracer_provider=self.provider,
                                    metrics=TracerMetrics(self.registry), keep=policy, hold=hold)
        self.release = threading.Event()
        self.runs: list[int] = []

        def handler(msg: Any) -> None:
            self.runs.append(msg.delivery_attempt)
            if len(self.runs) == 1:
                self.release.wait(10)

        self.loop = ConsumeLoop(self.consumer, handler, monotonic=self.clock, workers=2, tracer=self.tracer,
                                invisible_duration=3, renew_margin=1, retry_backoff=lambda attempt: 1)

    def lost(self, reason: str) -> float:
        return self.registry.get_sample_value(
            "rmqtrace_consumer_leases_lost_total", {"topic": "T", "consumer_group": "G", "reason": reason}) or 0.0

    def process_spans(self) -> list[Any]:
        return [s for s in self.exporter.get_finished_spans() if s.name.startswith("process")]


@pytest.mark.parametrize("keep", [False, True], ids=["head-sampled", "keep-policy"])
def test_item5_a_lost_lease_is_counted_marked_and_the_redelivery_links_to_the_lost_run(keep):
    rig = Rig(keep)
    loop = rig.loop
    try:
        assert loop.poll() == 1
        wait_until(lambda: rig.runs == [1], what="the first run starts")
        rig.clock.advance(3.5)  # a stall: the lease ran out before the keeper renewed it
        loop.renew_leases()
        assert loop.statistics().leases_lost == 1
        assert rig.lost("expired") == 1.0, "a lost lease must reach Prometheus, not only statistics()"
        rig.release.set()
        assert loop.dispatcher.wait_idle(timeout=5)
        loop.settle_ready()
        assert loop.statistics().expired == 1
        first = rig.process_spans()
        assert len(first) == 1
        assert first[0].attributes.get(n.LEASE_LOST) == "expired", "the run whose lease was lost is not marked"
        # the broker hands the message out again: the duplicate run
        assert loop.poll() == 1
        wait_until(lambda: rig.runs == [1, 2], what="the redelivery runs")
        assert loop.dispatcher.wait_idle(timeout=5)
        loop.settle_ready()
        assert loop.statistics().acked == 1
        spans = rig.process_spans()
        assert len(spans) == 2
        second = spans[1]
        assert n.LEASE_LOST not in second.attributes
        linked = [link for link in second.links
                  if link.attributes and link.attributes.get(n.LINK_REASON) == n.LINK_LEASE_LOST]
        assert [link.context.span_id for link in linked] == [first[0].context.span_id], \
            "the redelivery does not link to the run whose lease was lost"
        assert rig.lost("expired") == 1.0  # once per delivery, not again at its settle
    finally:
        rig.release.set()
        loop.dispatcher.close(timeout=5)


def test_item5_a_lease_found_gone_at_settle_is_counted_too():
    """The lease ran out between two keeper passes: the settle lets the message expire; before,
    not even statistics().leases_lost said so."""
    rig = Rig(False)
    loop = rig.loop
    try:
        assert loop.poll() == 1
        wait_until(lambda: rig.runs == [1], what="the first run starts")
        rig.clock.advance(3.5)  # no keeper pass now
        rig.release.set()
        assert loop.dispatcher.wait_idle(timeout=5)
        loop.settle_ready()
        assert loop.statistics().expired == 1
        assert rig.lost("expired") == 1.0
    finally:
        rig.release.set()
        loop.dispatcher.close(timeout=5)


def test_item5_a_lost_lease_reason_outside_the_set_is_refused():
    rig = Rig(False)
    try:
        trace = rig.tracer.start_message(MessageInfo("T"))
        with pytest.raises(ValueError, match="expired"):
            trace.lease_lost("stolen")
    finally:
        rig.loop.dispatcher.close(timeout=5)


@pytest.mark.parametrize("multiprocess", [False, True], ids=["collector", "stock"])
def test_item5_the_lost_lease_series_start_at_zero_with_the_consumers_first_message(
        multiprocess: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """A counter child created by the first loss is born at 1: rate() and increase() see no
    increase, so the dashboard and any alert missed a consumer's first lost lease (and the panel
    had no series at all until then)."""
    if multiprocess:
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    reg = CollectorRegistry()
    metrics = TracerMetrics(reg)
    try:
        t = MessageTracer(consumer_group="G", metrics=metrics).start_message(MessageInfo(topic="T", message_id="m"))
        with t.handler_scope():
            pass
        t.finish(Outcome.SUCCESS)
        for reason in n.LEASE_LOST_REASONS:
            labels = {"topic": "T", "consumer_group": "G", "reason": reason}
            assert reg.get_sample_value("rmqtrace_consumer_leases_lost_total", labels) == 0, reason
    finally:
        metrics.unregister()
