"""Every delivery the consume loop gives back unrun from its own backlog is measured once.

The dispatcher finishes the traces of what it held; what the loop gives back before the dispatcher
ever took it (its backlog at a bounded stop, the successors of a hung key, a batch whose ``key=``
raised a Ctrl-C) had no one to finish its trace: no ``rmqtrace_messages_total`` count, and an
occupancy tracker counting it as waiting for ever — a phantom head-of-line blocking and a stalled
consumer on an idle loop (the telemetry review of issue 31, scripts 01 and 06; fails before).
"""

from __future__ import annotations

import ast
import threading
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from waiting import wait_until

from tracer.clients.consume import ConsumeLoop
from tracer.dispatch.policy import Aggressive
from tracer.embedded import EmbeddedBroker, FilterExpression, Message, Producer, SimpleConsumer
from tracer.telemetry.metrics import TracerMetrics
from tracer.telemetry.occupancy import Occupancy
from tracer.telemetry.tracer import MessageTracer

CONSUME = Path(__file__).resolve().parent.parent / "tracer" / "clients" / "consume.py"


class _Rig:
    def __init__(self) -> None:
        self.broker = EmbeddedBroker(min_receive_invisible=1)
        self.broker.create_topic("T")
        self.registry = CollectorRegistry()
        self.occupancy = Occupancy(2)
        self.tracer = MessageTracer(consumer_group="G", metrics=TracerMetrics(self.registry),
                                    occupancy=self.occupancy)
        self.consumer = SimpleConsumer(self.broker, "G", {"T": FilterExpression()}, await_duration=0.05)
        self.consumer.startup()
        self.producer = Producer(self.broker, ["T"])
        self.producer.startup()

    def send(self, body: bytes, key: str) -> None:
        m = Message()
        m.topic, m.body, m.keys = "T", body, key
        self.producer.send(m)

    def measured(self) -> float:
        return sum(s.value for fam in self.registry.collect() if fam.name == "rmqtrace_messages"
                   for s in fam.samples if s.name.endswith("_total"))


def _key(m: Any) -> Any:
    return m.keys[0] if m.keys else None


def _stop_with_backlog(rig: _Rig) -> ConsumeLoop:
    """A bounded stop gives back the loop's backlog (B waits behind its key's running head A)."""
    release, started = threading.Event(), threading.Event()

    def handler(m: Any) -> None:
        if m.body == b"A":
            started.set()
            release.wait(10)

    loop = ConsumeLoop(rig.consumer, handler, tracer=rig.tracer, policy=Aggressive(max_parked=0), workers=2,
                       key=_key, invisible_duration=30)
    t = threading.Thread(target=loop.run, daemon=True)
    t.start()
    rig.send(b"A", "k")
    assert started.wait(10)
    rig.send(b"B", "k")
    wait_until(lambda: loop.state().waiting == 1, what="B in the loop's backlog")
    loop.stop(timeout=0.2)
    release.set()
    t.join(10)
    return loop


def _hung_key_successor(rig: _Rig) -> ConsumeLoop:
    """A's handler times out while B (same key) waits in the backlog: B follows A back, unrun."""
    release, started = threading.Event(), threading.Event()

    def handler(m: Any) -> None:
        if m.body == b"A":
            started.set()
            release.wait(10)

    loop = ConsumeLoop(rig.consumer, handler, tracer=rig.tracer, policy=Aggressive(max_parked=0), workers=2,
                       key=_key, invisible_duration=30, handler_timeout=0.3)
    t = threading.Thread(target=loop.run, daemon=True)
    t.start()
    rig.send(b"A", "k")
    assert started.wait(10)
    rig.send(b"B", "k")
    wait_until(lambda: loop.statistics().not_started >= 1, what="B given back after A's timeout")
    release.set()
    loop.stop(timeout=5)
    t.join(10)
    return loop


def _ctrl_c_from_key(rig: _Rig) -> ConsumeLoop:
    """``key=`` raises a KeyboardInterrupt for a batch: it goes back unrun and run() re-raises."""

    def key(m: Any) -> Any:
        if m.body == b"B":
            raise KeyboardInterrupt
        return None

    loop = ConsumeLoop(rig.consumer, lambda m: None, tracer=rig.tracer, workers=2, key=key, invisible_duration=30)
    rig.send(b"B", "k")
    with pytest.raises(KeyboardInterrupt):
        loop.run()
    return loop


SCENARIOS = {"stop_with_backlog": _stop_with_backlog, "hung_key_successor": _hung_key_successor,
             "ctrl_c_from_key": _ctrl_c_from_key}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_delivery_the_loop_gives_back_unrun_is_measured_once(scenario: str) -> None:
    rig = _Rig()
    loop = SCENARIOS[scenario](rig)
    st = loop.statistics()
    assert st.not_started >= 1  # the scenario reached the give-back
    wait_until(lambda: rig.measured() == loop.statistics().succeeded + loop.statistics().failed
               + loop.statistics().not_started, what="every settled delivery measured")
    assert rig.occupancy.statistics().unstarted == 0  # no phantom waiting message after the give-back


def test_every_unrun_report_of_the_loop_finishes_its_trace() -> None:
    """The siblings: every place the loop reports a delivery it never ran goes through the one
    method that finishes the trace (a new give-back path cannot forget it)."""
    tree = ast.parse(CONSUME.read_text(encoding="utf-8"))
    bad = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef) or fn.name == "_give_back_unrun":
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "_report":
                ran = next((k.value for k in node.keywords if k.arg == "ran"), None)
                if isinstance(ran, ast.Constant) and ran.value is False:
                    bad.append(f"{fn.name}:{node.lineno}")
    assert bad == []
