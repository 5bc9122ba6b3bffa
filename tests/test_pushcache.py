"""watch_push_cache: a push consumer's received batches reach the occupancy at receive time, and
the traced listener's later receipt does not count them twice."""

from __future__ import annotations

from typing import Any

import pytest

from tracer.clients.pushcache import watch_push_cache
from tracer.path.clock import ManualClock
from tracer.path.message import MessageInfo
from tracer.path.stages import Outcome
from tracer.telemetry.occupancy import Occupancy
from tracer.telemetry.tracer import MessageTracer


class _ClientMetrics:
    def __init__(self) -> None:
        self.batches: list[int] = []

    def receive_after(self, consumer_group: Any, messages: Any) -> None:
        self.batches.append(len(messages))


class _PushConsumer:  # the surface of rocketmq.PushConsumer that the seam uses
    def __init__(self) -> None:
        self.client_metrics = _ClientMetrics()


def test_batches_are_announced_and_traced_once() -> None:
    clock = ManualClock()
    occ = Occupancy(1, clock=clock)
    consumer = _PushConsumer()
    undo = watch_push_cache(consumer, occ)
    consumer.client_metrics.receive_after("g", ["m1", "m2", "m3"])  # the client cached a batch
    assert consumer.client_metrics.batches == [3]
    clock.advance_s(1)
    assert occ.statistics().unstarted == 3 and occ.statistics().hol_s == pytest.approx(1)
    tracer = MessageTracer(consumer_group="g", clock=clock, occupancy=occ)
    t = tracer.start_message(MessageInfo(topic="T"))  # the listener sees the first one start
    with t.handler_scope():
        assert (occ.statistics().busy, occ.statistics().unstarted) == (1, 2)
    t.finish(Outcome.SUCCESS)
    undo()
    consumer.client_metrics.receive_after("g", ["m4"])
    assert occ.statistics().unstarted == 2  # unwrapped: no longer announced


def test_a_consumer_without_the_seam_is_refused() -> None:
    with pytest.raises(TypeError, match="PushConsumer"):
        watch_push_cache(object(), Occupancy(1))
