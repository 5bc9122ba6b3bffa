"""Shared rig for the review scripts: embedded broker, in-memory spans, fresh registry."""
from __future__ import annotations

import threading
import time

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from tracer.embedded import EmbeddedBroker, FilterExpression, Message, Producer, SimpleConsumer
from tracer.telemetry.metrics import TracerMetrics
from tracer.telemetry.tracer import MessageTracer


class Rig:
    def __init__(self, topic="t", group="g", **tracer_kw):
        self.topic, self.group = topic, group
        self.broker = EmbeddedBroker(min_receive_invisible=1)
        self.broker.create_topic(topic)
        self.registry = CollectorRegistry()
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.metrics = TracerMetrics(self.registry)
        self.consumer = SimpleConsumer(self.broker, group, {topic: FilterExpression()}, await_duration=0.05)
        self.consumer.startup()
        self.producer = Producer(self.broker, [topic])
        self.producer.startup()
        self.tracer = MessageTracer(consumer_group=group, tracer_provider=self.provider, metrics=self.metrics,
                                    **tracer_kw)

    def send(self, body=b"x", keys=None, props=None):
        m = Message()
        m.topic = self.topic
        m.body = body
        if keys:
            m.keys = keys
        for k, v in (props or {}).items():
            m.add_property(k, v)
        return self.producer.send(m)

    def count(self, outcome):
        v = self.registry.get_sample_value("rmqtrace_messages_total",
                                           {"topic": self.topic, "consumer_group": self.group, "outcome": outcome})
        return v or 0.0

    def outcomes(self):
        out = {}
        for fam in self.registry.collect():
            if fam.name == "rmqtrace_messages":
                for s in fam.samples:
                    if s.name.endswith("_total"):
                        out[s.labels["outcome"]] = out.get(s.labels["outcome"], 0) + s.value
        return out

    def spans(self, name=None):
        sp = self.exporter.get_finished_spans()
        return [s for s in sp if name is None or s.name.startswith(name)]


def wait_until(pred, timeout=5.0, what="condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.01)  # real-time: the reviewer's own polling wait, bounded by its deadline
    raise AssertionError(f"timed out waiting for {what}")
