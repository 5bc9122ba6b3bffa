"""A keyed message parked behind its own key under the aggressive policy is blamed on the key's
running message: the pool runs a key's next message on the worker that ran the last one, so from
its dispatch enqueue on it waited for that worker (the report's worker rule; tracer.report.blame).
On the embedded broker, checked against the stamps the handlers really ran at."""

from __future__ import annotations

import threading
import time
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from waiting import wait_until

from tracer.clients.consume import ConsumeLoop
from tracer.embedded import EmbeddedBroker, Message, Producer, SimpleConsumer
from tracer.path.blocking import GRACE_NS, HEAD_OF_LINE
from tracer.path.stages import Stage
from tracer.report.model import build_report
from tracer.telemetry.spanfile import SpanRecord, span_to_dict
from tracer.telemetry.tracer import MessageTracer

SLOW = 0.2
FAST = 0.005
BODIES = ("slow-0", "fast-1", "slow-2", "fast-3", "fast-4", "slow-5")


def work(seconds: float) -> None:
    time.sleep(seconds)  # real-time: a slow handler of one key is the subject


def _run() -> tuple[list[SpanRecord], dict[str, tuple[int, int, int]]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    broker = EmbeddedBroker(min_receive_invisible=1)
    broker.create_topic("T")
    producer = Producer(broker, ["T"])
    producer.startup()
    for body in BODIES:
        m = Message()
        m.topic, m.body, m.keys = "T", body.encode(), [body]
        producer.send(m)
    consumer = SimpleConsumer(broker, "G", {"T": None}, await_duration=0.05)
    consumer.startup()
    runs: dict[str, tuple[int, int, int]] = {}  # keys -> (worker, handler start, handler end), from the stamps
    lock = threading.Lock()

    def listen(t: Any, _outcome: Any) -> None:
        with lock:
            runs[t.info.keys[0]] = (t.worker, t.stamps.times[Stage.HANDLER_START], t.stamps.times[Stage.HANDLER_END])

    tracer = MessageTracer(consumer_group="G", tracer_provider=provider, listeners=[listen])
    loop = ConsumeLoop(consumer, lambda m: work(SLOW if m.body.startswith(b"slow") else FAST), tracer=tracer,
                       invisible_duration=30, workers=3, policy="aggressive",
                       key=lambda m: "slow" if m.body.startswith(b"slow") else None)  # the slow ones share a key
    th = threading.Thread(target=loop.run, daemon=True)
    th.start()
    wait_until(lambda: loop.statistics().acked == len(BODIES), what="every ack", timeout=30)
    loop.stop()
    th.join(10)
    return [SpanRecord(**span_to_dict(s)) for s in exporter.get_finished_spans()], runs


def test_a_message_parked_behind_its_key_is_blamed_on_the_keys_running_message() -> None:
    spans, runs = _run()
    [g] = build_report(spans).groups
    assert g.blame is not None and g.blame.blockers_known
    label = {r.message_id: r.keys for r in g.records}
    verdict = {label[m.message_id]: m for m in g.blame.messages}
    slow = [b for b in BODIES if b.startswith("slow")]
    for victim in slow[1:]:
        m = verdict[victim]
        # invariant: three workers, two fast messages: it waited for its key while a worker idled
        assert m.reason == HEAD_OF_LINE and m.avoidable_s > SLOW / 2, m
        blocker = label[m.blocker_id] if m.blocker_id else None
        # invariant: the blocker is an earlier message of its key that ran on its worker while it waited
        assert blocker in slow[:slow.index(victim)], (victim, blocker)
        (w, start, _), (bw, b_start, b_end) = runs[victim], runs[blocker]
        assert bw == w and b_start < start and b_end <= start + GRACE_NS
    # invariant: the key's first message held up the ones behind it, and the ranking says so
    assert label[g.blame.top[0].message_id] in slow[:-1]


def test_the_live_wait_span_names_the_same_blocker() -> None:
    """Live, the aggressive pool binds a parked message to the worker running its key (the one that
    runs it next), so its dispatch_wait span names the blocker too — the one the stamps say ran
    there while it waited."""
    from tracer.path import names as n

    spans, runs = _run()
    process = {s.trace_id: s for s in spans if s.name == "process T"}
    keys_of = {s.attributes[n.MESSAGE_ID]: s.attributes[n.MESSAGE_KEYS][0] for s in process.values()}
    waits = {keys_of[process[s.trace_id].attributes[n.MESSAGE_ID]]: s for s in spans
             if s.name == n.BLAME_SPAN and n.BLAME_REASON in s.attributes}
    slow = [b for b in BODIES if b.startswith("slow")]
    for victim in slow[1:]:
        span = waits[victim]
        assert span.attributes[n.BLAME_REASON] == HEAD_OF_LINE, span.attributes
        blocker = keys_of[span.attributes[n.BLAME_BLOCKER_MESSAGE_ID]]
        # invariant: an earlier message of its key, which ran on its worker while it waited
        assert blocker in slow[:slow.index(victim)], (victim, blocker)
        (w, start, _), (bw, b_start, b_end) = runs[victim], runs[blocker]
        assert bw == w and b_start < start and b_end <= start + GRACE_NS
