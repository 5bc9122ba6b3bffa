"""Model test of the embedded broker's FIFO queues (hypothesis stateful), on a manual clock.

The rules, each checked against the real proxy in ``tests/test_broker_rules_real.py``, kept here
under any interleaving of sends, receives of any size, acks, nacks (``change_invisible_duration``)
and time passing, with one queue per group or every group in one queue. The test keeps its own
account of each queue — the messages sent to it, how many are committed (acked in order), the
last run handed out with each message's end of invisibility and whether it was acked — and
checks every receive's answer against it.

Named invariants (each assertion's message starts ``invariant <name>:``):

``a_run_starts_at_the_first_uncommitted``
    a queue's messages in one receive are its consecutive messages from the first one not
    committed yet, in send order;
``no_run_while_one_of_the_last_is_in_flight``
    nothing of a queue is handed out while a message of its last run is neither acked nor past
    its invisible time;
``a_receive_leaves_nothing_it_could_take``
    a receive that is not full left out no queue that was free and had messages;
``a_run_carries_one_attempt``
    every message of a run has the same attempt: one more than the runs in a row that carried
    them all, 1 when one of them is new;
``backlog_is_what_is_not_committed``
    ``backlog()`` is the messages sent less those committed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from manual_clock import Clock

from tracer.embedded import EmbeddedBroker, Message, Producer, SimpleConsumer


@dataclass
class Queue:
    sent: list[str] = field(default_factory=list)  # message ids in send order
    committed: int = 0  # how many of sent are acked in order
    run: list[Any] = field(default_factory=list)  # the last run's messages
    until: dict[str, float] = field(default_factory=dict)  # message id -> end of invisibility (last run)
    acked: set[str] = field(default_factory=set)  # message ids of the last run acked
    repeats: dict[str, int] = field(default_factory=dict)  # message id -> runs in a row carrying it, less one

    def blocked(self, now: float) -> bool:
        return any(m.message_id not in self.acked and self.until[m.message_id] > now for m in self.run)


class EmbeddedFifoModel(RuleBasedStateMachine):
    @initialize(shared=st.booleans())
    def start(self, shared: bool) -> None:
        self.clock = Clock()
        self.broker = EmbeddedBroker(monotonic=self.clock, min_receive_invisible=1)
        self.shared = shared
        self.broker.create_topic("F", fifo=True, queues=1 if shared else None)
        self.producer = Producer(self.broker, ["F"])
        self.producer.startup()
        self.consumer = SimpleConsumer(self.broker, "G", {"F": None}, await_duration=0)
        self.consumer.startup()
        self.queues: dict[str, Queue] = {}
        self.last: list[Any] = []  # the last receive's answer

    def queue_of(self, group: str) -> Queue:
        return self.queues.setdefault("all" if self.shared else group, Queue())

    def live(self) -> list[Any]:
        """Messages of the queues' last runs not acked, whose handle has not expired."""
        now = self.clock()
        return [m for q in self.queues.values() for m in q.run
                if m.message_id not in q.acked and q.until[m.message_id] > now]

    @rule(group=st.sampled_from("abc"), count=st.integers(1, 3))
    def send(self, group: str, count: int) -> None:
        for _ in range(count):
            m = Message()
            m.topic, m.body, m.message_group = "F", b"x", group
            self.queue_of(group).sent.append(self.producer.send(m).message_id)

    @rule(n=st.integers(1, 6), invisible=st.sampled_from([1, 3, 10]))
    def receive(self, n: int, invisible: int) -> None:
        now = self.clock()
        free = {id(q) for q in self.queues.values() if not q.blocked(now) and q.committed < len(q.sent)}
        got = self.consumer.receive(n, invisible)
        assert len(got) <= n
        by_queue: dict[int, list[Any]] = {}
        for m in got:
            by_queue.setdefault(id(self.queue_of(m.message_group)), []).append(m)
        for q in self.queues.values():
            run = by_queue.get(id(q))
            if run is None:
                continue
            assert id(q) in free, (
                f"invariant no_run_while_one_of_the_last_is_in_flight: {[m.message_id for m in run]}")
            ids = [m.message_id for m in run]
            assert ids == q.sent[q.committed:q.committed + len(ids)], (
                f"invariant a_run_starts_at_the_first_uncommitted: {ids} vs {q.sent[q.committed:]}")
            earlier = {m.message_id for m in q.run}
            repeats = {i: q.repeats.get(i, 0) + 1 for i in ids if i in earlier}
            attempt = 1 + (min(repeats.values()) if len(repeats) == len(ids) else 0)
            assert {m.delivery_attempt for m in run} == {attempt}, (
                f"invariant a_run_carries_one_attempt: {[m.delivery_attempt for m in run]} != {attempt}")
            q.run, q.acked, q.repeats = run, set(), repeats
            q.until = {i: now + invisible for i in ids}
        if len(got) < n:
            left = [q.sent[q.committed] for q in self.queues.values() if id(q) in free and id(q) not in by_queue]
            assert not left, f"invariant a_receive_leaves_nothing_it_could_take: {left}"
        self.last = got

    @rule(pick=st.integers(0, 20))
    def ack(self, pick: int) -> None:
        live = self.live()
        if not live:
            return
        m = live[pick % len(live)]
        self.consumer.ack(m)
        q = self.queue_of(m.message_group)
        q.acked.add(m.message_id)
        run_ids = [r.message_id for r in q.run]
        start = q.sent.index(run_ids[0])
        while q.committed < start + len(run_ids) and q.sent[q.committed] in q.acked:
            q.committed += 1

    @rule(pick=st.integers(0, 20), seconds=st.sampled_from([0, 1, 3]))
    def nack(self, pick: int, seconds: int) -> None:
        live = self.live()
        if not live:
            return
        m = live[pick % len(live)]
        self.consumer.change_invisible_duration(m, seconds)
        self.queue_of(m.message_group).until[m.message_id] = self.clock() + seconds

    @rule(seconds=st.sampled_from([0.5, 1.0, 2.0, 5.0]))
    def tick(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @invariant()
    def backlog_is_what_is_not_committed(self) -> None:
        if hasattr(self, "broker"):
            left = sum(len(q.sent) - q.committed for q in self.queues.values())
            assert self.broker.backlog("G", "F") == left, (
                f"invariant backlog_is_what_is_not_committed: {self.broker.backlog('G', 'F')} != {left}")


EmbeddedFifoModel.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
test_embedded_fifo_model = EmbeddedFifoModel.TestCase


def test_groups_share_queues_by_the_5x_clients_hash() -> None:
    """``queues=N``: a group's queue is ``sha256(group) % N`` (the 5.x client's
    ``select_queue_by_hash_key``); groups of one queue block each other."""
    def queue(g: str) -> int:
        return int.from_bytes(hashlib.sha256(g.encode()).digest(), "big") % 4

    a, other = "a", next(g for g in "bcdefgh" if queue(g) == queue("a"))
    broker = EmbeddedBroker(min_receive_invisible=1)
    broker.create_topic("F", fifo=True, queues=4)
    producer = Producer(broker, ["F"])
    producer.startup()
    for g in (a, other):
        m = Message()
        m.topic, m.body, m.message_group = "F", g.encode(), g
        producer.send(m)
    consumer = SimpleConsumer(broker, "G", {"F": None}, await_duration=0)
    consumer.startup()
    first = consumer.receive(1, 10)
    assert [m.message_group for m in first] == [a]
    assert consumer.receive(8, 10) == []  # other waits behind a in their queue
    consumer.ack(first[0])
    assert [m.message_group for m in consumer.receive(8, 10)] == [other]
