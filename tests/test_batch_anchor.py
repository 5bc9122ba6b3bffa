"""A batch's pull is read on both clocks at once: a wall-clock step between the batch's reading
and a message's trace start moves the message as a whole, none of its own gaps.

Review #31 finding 14: the batch seams read the pull on the wall clock only, and start_message
placed the anchor ``now - pulled_ns`` (a wall distance) back on the monotonic clock, so NTP
stepping the wall clock 30 s forward between the two made a 30 s ``client_buffer`` (and
``consumer_wait``). Every seam that reads a batch's pull itself is a case (found in the source);
a seam whose pull time is the client's own wall reading is listed apart, with why.
"""

from __future__ import annotations

import ast
import time
from collections.abc import Callable

import pytest
from conftest import REPO
from test_consume import pipeline, run_in_thread
from waiting import wait_until

from tracer.clients.official import TracedSimpleConsumer
from tracer.embedded import EmbeddedBroker, Message, Producer, SimpleConsumer
from tracer.path.clock import Anchor, ManualClock
from tracer.path.message import MessageInfo
from tracer.path.stages import Outcome, Stage
from tracer.path.stamps import compute_gaps
from tracer.telemetry.tracer import MessageTrace, MessageTracer

STEP_NS = 30 * 10**9
MS = 1_000_000


class SteppedTracer(MessageTracer):
    """NTP steps the wall clock forward between the batch's pull reading and each trace start."""

    def start_message(self, info: MessageInfo, pulled_ns: Anchor | int | None = None,
                      body: object = None) -> MessageTrace:
        assert isinstance(self.clock, ManualClock)
        self.clock.advance(MS)
        self.clock.step_wall(STEP_NS)
        return super().start_message(info, pulled_ns, body)


def _tracer(finished: list[MessageTrace]) -> SteppedTracer:
    return SteppedTracer(consumer_group="G", clock=ManualClock(time.time_ns()),
                         listeners=[lambda t, o: finished.append(t)])


def _consume_loop(finished: list[MessageTrace]) -> None:
    _, loop = pipeline(1, lambda m: None, tracer=_tracer(finished), workers=1)
    t = run_in_thread(loop)
    try:
        wait_until(lambda: loop.statistics().acked == 1, what="the message acked")
    finally:
        loop.stop()
        t.join(10)


def _simple_consumer(finished: list[MessageTrace]) -> None:
    broker = EmbeddedBroker()
    broker.create_topic("T")
    producer = Producer(broker)
    producer.startup()
    m = Message()
    m.topic, m.body = "T", b"x"
    producer.send(m)
    raw = SimpleConsumer(broker, "G", {"T": None}, await_duration=0)
    raw.startup()
    consumer = TracedSimpleConsumer(raw, _tracer(finished))
    (got,) = consumer.receive(1, 30)
    consumer.ack(got)


# module that reads a batch's pull -> the seam run through its public API
SEAMS: dict[str, Callable[[list[MessageTrace]], None]] = {
    "tracer/clients/consume.py": _consume_loop,  # ConsumeLoop._start_traces
    "tracer/clients/official.py": _simple_consumer,  # ReceivedTraces.received (the instrumentor's too)
}
# modules that start traces but do not read the pull themselves
NOT_A_BATCH = {
    "tracer/clients/listener.py": "the pull time is the client's own wall reading (decode_ms) or now: "
                                  "no monotonic partner exists for it",
}


@pytest.mark.parametrize("seam", sorted(SEAMS))
def test_a_wall_step_after_the_batch_read_is_no_gap_of_the_message(seam: str) -> None:
    finished: list[MessageTrace] = []
    SEAMS[seam](finished)
    (t,) = finished
    gaps = {g.gap.name: g.seconds for g in compute_gaps(t.stamps)}
    # fails before: the 30 s step was client_buffer and consumer_wait (ConsumeLoop), or handler
    # (TracedSimpleConsumer: the pull and the handler start shared the batch's wall reading)
    own = {"client_buffer", "dispatch_wait", "consumer_wait", "handler"}  # same-process gaps
    assert own <= set(gaps) and all(gaps[g] < 1.0 for g in own), gaps
    assert t.stamps.get(Stage.CLIENT_PULL) <= t.stamps.get(Stage.HANDLER_START)


def test_an_anchor_of_another_clock_counts_only_as_its_wall_time() -> None:
    clock, other = ManualClock(time.time_ns()), ManualClock(time.time_ns())
    other.advance(10**12)  # its monotonic reading means nothing on the tracer's clock
    mt = MessageTracer(consumer_group="G", clock=clock)
    pulled = Anchor(other, clock.wall_ns())
    clock.advance(5 * MS)
    t = mt.start_message(MessageInfo(topic="T", message_id="M"), pulled)
    t.mark(Stage.DISPATCH_ENQUEUE)
    t.finish(Outcome.SUCCESS)
    gaps = {g.gap.name: g.seconds for g in compute_gaps(t.stamps)}
    assert gaps["client_buffer"] == pytest.approx(0.005)


def _modules_starting_traces() -> set[str]:
    found = set()
    for path in sorted((REPO / "tracer").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith("tracer/tools/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "start_message":
                found.add(rel)
    return found


def test_every_seam_that_starts_traces_is_a_case_or_says_why_not() -> None:
    assert _modules_starting_traces() == set(SEAMS) | set(NOT_A_BATCH)


