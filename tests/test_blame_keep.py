"""Issue 31 item 7: blame-aware keep — a kept victim's blame link never dangles.

A head-of-line victim is kept (slow ``dispatch_wait``) while its blocker, judged alone, is
dropped: before, the victim's wait span linked to a blocker ``handler`` span that was never
exported. Now the blocker is kept too (reason ``blocker``; revived from the hold when its drop
came first, within its bounds), and past those bounds the link is left out and counted.
"""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased

from tracer.path.blocking import Verdict
from tracer.path.clock import ManualClock
from tracer.path.message import MessageInfo
from tracer.path.propagation import PRODUCE_NS, TRACEPARENT
from tracer.path.stages import Outcome, Stage
from tracer.telemetry import hold as hold_module
from tracer.telemetry.hold import HoldingSpanProcessor
from tracer.telemetry.keep import KeepPolicy
from tracer.telemetry.tracer import MessageTracer


class _Collect(SpanProcessor):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.spans.append(span)


class Rig:
    def __init__(self) -> None:
        self.clock = ManualClock()
        self.out = _Collect()
        self.hold = HoldingSpanProcessor([self.out], clock=self.clock, ticker=False)
        provider = TracerProvider(sampler=ParentBased(ALWAYS_OFF))
        provider.add_span_processor(self.hold)
        self.user = provider.get_tracer("user")
        self.policy = KeepPolicy({"dispatch_wait": 0.1}, clock=self.clock)
        self.mt = MessageTracer(consumer_group="g", tracer_provider=provider, clock=self.clock, keep=self.policy,
                                hold=self.hold)
        self.n = 0

    def start(self, wait_s: float) -> Any:
        self.n += 1
        props = {TRACEPARENT: f"00-{self.n:032x}-{self.n:016x}-00", PRODUCE_NS: str(self.clock.now_ns() - 1_000_000)}
        t = self.mt.start_message(MessageInfo(topic="T", message_id=f"m{self.n}", properties=props))
        t.mark(Stage.DISPATCH_ENQUEUE)
        self.clock.advance_s(wait_s)
        t.__enter__()
        return t

    def run_blocker(self) -> Any:
        b = self.start(0.001)
        with self.user.start_as_current_span("blocker-work"):
            pass
        self.clock.advance_s(0.5)
        b.__exit__(None, None, None)
        return b

    def exported(self) -> dict[int, ReadableSpan]:
        return {s.context.span_id: s for s in self.out.spans}

    def wait_link(self, victim_id: str) -> list[int]:
        for s in self.out.spans:
            if s.name == "dispatch_wait" and any(
                    p.name.startswith("process") and p.attributes.get("messaging.message.id") == victim_id
                    and p.context.span_id == s.parent.span_id for p in self.out.spans):
                return [link.context.span_id for link in s.links]
        raise AssertionError(f"no dispatch_wait span of {victim_id}")


@pytest.mark.parametrize("order", ["blocker_decided_first", "blocker_decided_after"])
def test_item7_a_kept_victims_blocker_is_kept(order):
    rig = Rig()
    if order == "blocker_decided_first":  # head of line: the blocker ends, then its victim starts
        blocker = rig.run_blocker()
        blocker.finish(Outcome.SUCCESS)
        victim = rig.start(0.5)  # slow dispatch_wait: kept
        victim.blame(Verdict("head_of_line", 0.5, 0.5, "m1", blocker), "round_robin")
    else:  # the victim is judged while its blocker is still unsettled
        blocker = rig.run_blocker()
        victim = rig.start(0.5)
        victim.blame(Verdict("head_of_line", 0.5, 0.5, "m1", blocker), "round_robin")
    rig.clock.advance_s(0.01)
    victim.__exit__(None, None, None)
    victim.finish(Outcome.SUCCESS)
    if order == "blocker_decided_after":
        blocker.finish(Outcome.SUCCESS)
    exported = rig.exported()
    links = rig.wait_link(victim.info.message_id)
    assert links == [blocker.handler_context().span_id]
    assert links[0] in exported, "the blame link points at a blocker span that was never exported"
    names = {s.name for s in exported.values() if s.context.trace_id == blocker.trace_id}
    assert {"handler", "blocker-work", "process T"} <= names  # the blocker's whole trace, user span too
    k = rig.policy.statistics()
    assert k.by_reason["blocker"] == 1 and k.messages == k.kept + k.dropped + k.pending
    assert k.blockers_unkept == 0


def test_item7_past_the_hold_bound_the_link_is_left_out_and_counted(monkeypatch):
    monkeypatch.setattr(hold_module, "RECENT_TRACES", 1)
    rig = Rig()
    blocker = rig.run_blocker()
    blocker.finish(Outcome.SUCCESS)
    rig.run_blocker().finish(Outcome.SUCCESS)  # another drop pushes the blocker out of reach
    victim = rig.start(0.5)
    victim.blame(Verdict("head_of_line", 0.5, 0.5, "m1", blocker), "round_robin")
    victim.__exit__(None, None, None)
    victim.finish(Outcome.SUCCESS)
    assert rig.wait_link(victim.info.message_id) == []
    assert rig.policy.statistics().blockers_unkept == 1
