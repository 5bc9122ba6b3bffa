"""``send_job(priority_levels=)``: a job's messages get priorities falling with the send order, so
a PRIORITY topic (RocketMQ 5.5) hands the job out in exactly that order, to whichever consumer
asks. The broker's rules themselves are in tests/test_broker_rules_real.py (both brokers)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_legacy_adapter import FakeMessage, FakeProducer

from tracer import MessageTracer, TracedProducer
from tracer.clients.legacy import TracedLegacyProducer
from tracer.clients.producer import JobSendError
from tracer.dispatch.cost import MAX_PRIORITY, check_priority_levels, job_priorities
from tracer.embedded import EmbeddedBroker, Message, Producer, SimpleConsumer
from tracer.path.names import JOB_ORDER_PROPERTY, PRIORITY_PROPERTY

COSTS = [0.03, 3.9, 0.2, 0.01, 1.5, 0.04, 0.6, 2.2, 0.05, 0.02, 0.9, 0.03]
LPT = sorted(range(len(COSTS)), key=lambda i: -COSTS[i])  # the index order longest first (costs distinct)


# -- the levels ------------------------------------------------------------------------------------
@given(st.lists(st.floats(0, 1e4), max_size=60), st.integers(1, 40))
def test_levels_fall_with_the_send_order_from_the_top_each_about_its_share_of_the_work(
        costs: list[float], levels: int) -> None:
    got = job_priorities(costs, levels)
    assert len(got) == len(costs)
    assert all(0 <= p <= levels - 1 for p in got)
    assert all(a >= b for a, b in zip(got, got[1:])), "a later message must never outrank an earlier one"
    if costs:
        assert got[0] == levels - 1
    total = sum(costs)
    if total > 0:
        for level in set(got):
            # a level starts below its share of the work: what it holds is that share plus one message
            work = sum(c for c, p in zip(costs, got) if p == level)
            assert work <= total / levels + max(costs) + 1e-9 * total


def test_a_job_without_work_is_one_level_the_top() -> None:
    assert job_priorities([0.0, 0.0, 0.0], 4) == [3, 3, 3]
    assert job_priorities([], 4) == []


def test_a_long_message_takes_levels_of_its_own_short_ones_share_one() -> None:
    # 7.4 s of work over 4 levels: 1.85 s each; the 4 s message spans two levels' worth
    assert job_priorities([4.0, 3.0, 0.1, 0.1, 0.1, 0.1], 4) == [3, 1, 0, 0, 0, 0]
    assert job_priorities([1.0, 1.0, 1.0, 1.0], 4) == [3, 2, 1, 0]


@pytest.mark.parametrize("bad, error", [(True, ValueError), (4.0, ValueError), ("4", TypeError), (0, ValueError),
                                        (-1, ValueError), (MAX_PRIORITY + 2, ValueError)])
def test_priority_levels_that_cannot_work_are_refused(bad: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="priority_levels"):
        check_priority_levels(bad)
    assert check_priority_levels(None) is None
    assert check_priority_levels(MAX_PRIORITY + 1) == MAX_PRIORITY + 1


# -- send_job on the embedded broker ---------------------------------------------------------------
class NoPriority:
    """A message of a client without priorities: it takes properties, nothing else."""

    def add_property(self, key: str, value: str) -> None:
        pass


def _job(topic: str, n: int = len(COSTS)) -> list[Message]:
    out = []
    for i in range(n):
        m = Message()
        m.topic, m.keys, m.body = topic, str(i), str(i).encode()
        out.append(m)
    return out


def _cost(m: Any) -> float:
    return COSTS[int(m.body)]


def _broker(queues: int = 8) -> tuple[EmbeddedBroker, TracedProducer]:
    broker = EmbeddedBroker(min_receive_invisible=1)
    broker.create_topic("jobs", priority=True, queues=queues)
    broker.create_topic("plain")
    producer = TracedProducer(Producer(broker, ["jobs", "plain"]), MessageTracer())
    producer.startup()
    return broker, producer


def _take_round_robin(broker: EmbeddedBroker, consumers: int, n: int) -> list[Message]:
    """Receives of one at a time by ``consumers`` members of one group in turn, as a fleet asks."""
    members = [SimpleConsumer(broker, "fleet", {"jobs": None}, await_duration=0) for _ in range(consumers)]
    for c in members:
        c.startup()
    got: list[Message] = []
    while len(got) < n:
        for c in members:
            got.extend(c.receive(1, 30))
    return got


@pytest.mark.parametrize("queues", [1, 3, 8, 1000])
def test_a_job_sent_with_priorities_comes_out_longest_first_to_every_member(queues: int) -> None:
    broker, producer = _broker(queues)
    producer.send_job(_job("jobs"), cost=_cost, job_id="j", priority_levels=queues)
    got = _take_round_robin(broker, 3, len(COSTS))
    assert [int(m.body) for m in got] == LPT
    assert [m.priority for m in got] == job_priorities([COSTS[i] for i in LPT], queues)
    assert {m.properties[JOB_ORDER_PROPERTY] for m in got} == {"longest_first"}


def test_sent_in_arrival_order_with_priorities_the_job_keeps_that_order() -> None:
    broker, producer = _broker(4)
    producer.send_job(_job("jobs"), cost=_cost, order="arrival", priority_levels=4)
    assert [int(m.body) for m in _take_round_robin(broker, 2, len(COSTS))] == list(range(len(COSTS)))


def test_a_message_that_cannot_carry_a_priority_is_named_and_nothing_is_sent() -> None:
    broker, producer = _broker()
    job = _job("jobs")
    job[5].message_group = "g"
    with pytest.raises(ValueError, match=r"message 5 \(key '5'\) has a message_group"):
        producer.send_job(job, cost=_cost, priority_levels=8)
    assert broker.stored("jobs") == 0
    assert all(m.priority is None for m in job), "no message is changed before every one is checked"
    with pytest.raises(ValueError, match=r"message 0 .*has no priority"):
        producer.send_job([NoPriority()], cost=lambda m: 1.0, key=lambda m: "k", priority_levels=8)
    with pytest.raises(TypeError, match=r"message 1 .*is not a message"):
        producer.send_job([job[0], None], cost=lambda m: 1.0, key=lambda m: "k", priority_levels=8)
    with pytest.raises(ValueError, match="priority_levels .* must be a whole number"):
        producer.send_job(_job("jobs"), cost=_cost, priority_levels=8.0)  # type: ignore[arg-type]
    assert broker.stored("jobs") == 0


def test_priorities_to_a_normal_topic_fail_the_first_send_and_say_why() -> None:
    broker, producer = _broker()
    with pytest.raises(JobSendError, match="message_type:PRIORITY, queue access type:NORMAL") as err:
        producer.send_job(_job("plain"), cost=_cost, priority_levels=4)
    assert (len(err.value.sent), len(err.value.unsent)) == (0, len(COSTS) - 1)
    assert "\n" not in str(err.value)
    with pytest.raises(JobSendError, match="message_type:NORMAL, queue access type:PRIORITY"):
        producer.send_job(_job("jobs"), cost=_cost)  # a PRIORITY topic takes no message without one


def test_the_2x_producer_writes_the_brokers_priority_property() -> None:
    fake = FakeProducer()
    producer = TracedLegacyProducer(fake, MessageTracer())
    job = [FakeMessage("jobs") for _ in COSTS]
    for i, m in enumerate(job):
        m.set_keys(str(i))
    producer.send_job(job, cost=lambda m: COSTS[job.index(m)], priority_levels=4)
    sent = [job.index(m) for m in fake.sent]
    assert sent == LPT
    assert [int(m._native["props"][PRIORITY_PROPERTY.encode()]) for m in fake.sent] == job_priorities(
        [COSTS[i] for i in LPT], 4)
    with pytest.raises(TypeError, match=r"message 1 .*is not a message"):
        producer.send_job([job[0], object()], cost=lambda m: 1.0, key=lambda m: "k", priority_levels=4)


# -- the real broker -------------------------------------------------------------------------------
def _received_in_order(topic: str, n: int) -> list[int]:
    import rmq_real

    consumer = rmq_real.start_simple(rmq_real.fresh_group("prio-job"), topic, await_duration=1)
    try:
        got: list[int] = []
        end = time.monotonic() + 60
        while len(got) < n and time.monotonic() < end:
            for m in consumer.receive(1, 30):
                got.append(int(m.body))
                consumer.ack(m)
        return got
    finally:
        rmq_real.quietly(consumer.shutdown)


@pytest.mark.integration
def test_on_the_real_broker_a_job_sent_with_priorities_comes_out_exactly_longest_first() -> None:
    import rmq_real

    rmq_real.ensure_broker()
    topic = rmq_real.fresh_topic("prio-job", priority=True, queues=4)
    raw = rmq_real.start_producer(topic)
    try:
        messages = [rmq_real.message(topic, str(i), keys=str(i)) for i in range(len(COSTS))]
        TracedProducer(raw, MessageTracer()).send_job(messages, cost=_cost, job_id="j", priority_levels=4)
    finally:
        rmq_real.quietly(raw.shutdown)
    assert _received_in_order(topic, len(COSTS)) == LPT


@pytest.mark.integration
def test_on_the_real_broker_the_2x_producer_s_priorities_order_the_job(tmp_path: Any) -> None:
    import rmq_real
    from test_legacy_real import _legacy_python

    rmq_real.ensure_broker()
    topic = rmq_real.fresh_topic("prio-legacy", priority=True, queues=4)
    env = dict(os.environ, RMQ_TOPIC=topic, COSTS=",".join(map(str, COSTS)), LEVELS="4", PYTHONPATH="",
               ROCKETMQ_CLIENT_LOG_DIR=str(tmp_path))
    proc = subprocess.run([_legacy_python(), str(rmq_real.REPO / "tests" / "legacy_programs" / "send_job.py")],
                          cwd=rmq_real.REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"sent": len(COSTS)}
    assert _received_in_order(topic, len(COSTS)) == LPT


@pytest.mark.integration
def test_on_the_real_broker_a_job_failed_for_its_priorities_resends_plain() -> None:
    """priority_levels given for a normal topic by mistake: the first send fails (the 5.x client
    refuses a PRIORITY message there), the failed message gets its priority taken off again and
    the unsent ones never got one, so the rest resends as given (review39 02)."""
    import rmq_real

    rmq_real.ensure_broker()
    topic = rmq_real.fresh_topic("prio-mistake")
    raw = rmq_real.start_producer(topic)
    try:
        producer = TracedProducer(raw, MessageTracer())
        messages = [rmq_real.message(topic, str(i), keys=str(i)) for i in range(3)]
        with pytest.raises(JobSendError, match="message_type:PRIORITY, queue access type:NORMAL") as err:
            producer.send_job(messages, cost=lambda m: 1.0, priority_levels=4)
        assert [m.priority for m in (err.value.failed, *err.value.unsent)] == [None, None, None]
        assert len(producer.send_job([err.value.failed, *err.value.unsent], cost=lambda m: 1.0)) == 3
    finally:
        rmq_real.quietly(raw.shutdown)


def _send_job_seams() -> list[Any]:
    """Every class of the package with a send_job (found, not listed)."""
    import importlib
    import inspect
    import pkgutil

    import tracer

    found = []
    for info in pkgutil.walk_packages(tracer.__path__, "tracer."):
        if info.name.endswith("__main__"):  # importing it runs the command line
            continue
        try:
            module = importlib.import_module(info.name)
        except Exception:  # noqa: BLE001 - a module whose optional client is missing
            continue
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == info.name and "send_job" in vars(cls):
                found.append(cls)
    return found


def test_every_send_job_takes_priority_levels_and_refuses_junk_before_sending() -> None:
    seams = _send_job_seams()
    assert {c.__name__ for c in seams} >= {"TracedProducer", "TracedLegacyProducer"}
    for cls in seams:
        fake = FakeProducer()
        producer = cls(fake, MessageTracer())
        for junk, error in ((0, ValueError), (True, ValueError), ("8", TypeError)):
            with pytest.raises(error, match="priority_levels"):
                producer.send_job([FakeMessage("jobs")], cost=lambda m: 1.0, key=lambda m: "k",
                                  priority_levels=junk)
        assert fake.sent == [], cls.__name__
