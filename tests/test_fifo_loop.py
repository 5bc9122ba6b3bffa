"""What the consume loop does on a FIFO topic, on the real proxy and on the embedded broker alike.

A failed message of a group is given back (nacked) and its group's later messages of the same
receive run on past it (README: "a failed FIFO message does not hold back its message group's
later ones"). The broker then hands the queue out again from the failed message on, the later
ones with it although they were acked (``tests/test_broker_rules_real.py``): they run twice, and
before the failed one's successful run. Before the embedded broker read FIFO queues as the proxy
does, it held a group's later messages back until the failed one was acked, so on it the loop ran
``a0 a0 a1 a2 a3`` — and no test saw what the proxy makes of the same loop (RELIABILITY "Known
limits").
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from fifo_side import KINDS, FifoSide

from tracer.clients.consume import ConsumeLoop, DispatchOptions, FlowOptions, LeaseOptions


@pytest.mark.parametrize("kind", KINDS)
def test_a_failed_fifo_message_s_group_runs_past_it_and_then_again(kind: str) -> None:
    side = FifoSide(kind, queues=1, manual_clock=False)
    ran: list[tuple[str, int]] = []
    lock = threading.Lock()

    def handler(m: Any) -> None:
        body = m.body.decode()
        with lock:
            ran.append((body, m.delivery_attempt))
            first = [b for b, _ in ran].count(body) == 1
        if body == "a0" and first:
            raise RuntimeError("a0 fails its first run")

    side.send("a0", "a1", "a2", "a3")  # before the loop starts: its first receive takes all four
    loop = ConsumeLoop(side.consumer, handler, dispatch=DispatchOptions(workers=4, key=lambda m: m.message_group),
                       lease=LeaseOptions(invisible_duration=10), flow=FlowOptions(retry_backoff=lambda attempt: 1))
    runner = threading.Thread(target=loop.run, name="fifo-loop", daemon=True)
    runner.start()
    try:
        assert loop.wait(lambda s: s.acked == 7, timeout=60), f"not 7 acks within 60 s: {ran}"
    finally:
        loop.stop(timeout=10)
        runner.join(10)
        side.close()
    assert ran == [("a0", 1), ("a1", 1), ("a2", 1), ("a3", 1), ("a0", 2), ("a1", 2), ("a2", 2), ("a3", 2)]
