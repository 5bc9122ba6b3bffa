import threading
from collections import Counter

import pytest
from manual_clock import Clock
from waiting import wait_until

from tracer.clients.consume import (
    ConsumeLoop,
    DispatchOptions,
    FlowOptions,
    LeaseOptions,
    LeaseRefused,
)
from tracer.clients.producer import TracedProducer
from tracer.dispatch import Aggressive, Dispatcher, Random, RoundRobin
from tracer.embedded import EmbeddedBroker, Message, Producer, SimpleConsumer
from tracer.path.stages import Stage
from tracer.telemetry.metrics import TracerMetrics
from tracer.telemetry.tracer import MessageTracer


def pipeline(n: int, handler, *, invisible: float = 30.0, tracer=None, producer_tracer=None, clock=None,
             bodies=None, workers: int = 4, consumer_wrapper=None, **kw):
    broker = EmbeddedBroker(min_receive_invisible=1, **({"monotonic": clock} if clock else {}))
    broker.create_topic("T")
    producer = Producer(broker, ["T"])
    producer.startup()
    if producer_tracer is not None:
        producer = TracedProducer(producer, producer_tracer)
    for body in bodies or [f"{i}" for i in range(n)]:
        m = Message()
        m.topic, m.body = "T", body.encode()
        producer.send(m)
    consumer = SimpleConsumer(broker, "G", {"T": None}, await_duration=0.05)
    consumer.startup()
    if consumer_wrapper is not None:
        consumer = consumer_wrapper(consumer)
    if clock is not None:
        kw["monotonic"] = clock
    loop = ConsumeLoop(consumer, handler, tracer=tracer, invisible_duration=invisible, workers=workers, **kw)
    return broker, loop


def run_in_thread(loop):
    t = threading.Thread(target=loop.run, daemon=True)
    t.start()
    return t


def test_n_sent_n_handled_with_all_six_stamps(spans, registry):
    provider, exporter = spans
    seen = []
    lock = threading.Lock()

    def handler(m):
        with lock:
            seen.append(m.body)

    stamps = []
    tracer = MessageTracer(consumer_group="G", tracer_provider=provider, metrics=TracerMetrics(registry),
                           listeners=[lambda t, o: stamps.append(list(t.stamps.times))])
    broker, loop = pipeline(50, handler, tracer=tracer, producer_tracer=MessageTracer(tracer_provider=provider))
    t = run_in_thread(loop)
    wait_until(lambda: loop.statistics().acked == 50, what="50 acks")
    loop.stop()
    t.join(10)
    assert sorted(seen) == sorted(f"{i}".encode() for i in range(50))
    assert broker.backlog("G", "T") == 0
    assert len(stamps) == 50 and all(all(s[st] for st in Stage) for s in stamps)
    process = [s for s in exporter.get_finished_spans() if s.name == "process T"]
    sends = {s.context.span_id for s in exporter.get_finished_spans() if s.name == "send T"}
    assert len(process) == 50 and all(p.parent.span_id in sends for p in process)


def test_failed_message_is_redelivered_with_attempt_two_then_acked():
    attempts = []

    def handler(m):
        attempts.append(m.delivery_attempt)
        if m.delivery_attempt == 1:
            raise RuntimeError("first try fails")

    broker, loop = pipeline(1, handler, retry_backoff=lambda attempt: 0.05)
    t = run_in_thread(loop)
    wait_until(lambda: loop.statistics().acked == 1, what="ack after retry")
    loop.stop()
    t.join(10)
    assert attempts == [1, 2]
    assert loop.statistics().failed == 1 and loop.statistics().retry_scheduled == 1 and loop.statistics().redelivered == 1


def test_long_handler_keeps_its_lease_and_is_not_redelivered():
    release = threading.Event()
    deliveries = []

    def handler(m):
        deliveries.append(m.delivery_attempt)
        release.wait(5)

    broker, loop = pipeline(1, handler, invisible=1, renew_margin=0.7)
    t = run_in_thread(loop)
    wait_until(lambda: loop.statistics().leases_extended >= 3, what="lease renewals past the first lease")
    release.set()
    wait_until(lambda: loop.statistics().acked == 1, what="ack")
    loop.stop()
    t.join(10)
    assert deliveries == [1]
    assert loop.statistics().ack_errors == 0


def test_stop_drains_in_flight_work_and_acks_it():
    started = threading.Event()
    release = threading.Event()

    def handler(m):
        started.set()
        release.wait(5)

    broker, loop = pipeline(4, handler)
    t = run_in_thread(loop)
    started.wait(5)
    loop.stop()
    release.set()
    t.join(10)
    assert not t.is_alive()
    assert loop.statistics().acked == loop.statistics().received and loop.statistics().received >= 1
    assert broker.backlog("G", "T") == 4 - loop.statistics().acked


def test_receive_errors_are_counted_and_survived():
    class Flaky:
        def __init__(self):
            self.calls = 0

        def receive(self, n, inv):
            self.calls += 1
            raise ConnectionError("broker down")

    consumer = Flaky()
    loop = ConsumeLoop(consumer, lambda m: None, workers=2)
    t = run_in_thread(loop)
    wait_until(lambda: loop.statistics().receive_errors >= 2, what="two receive errors")
    loop.stop()
    t.join(10)
    assert loop.statistics().errors_by_kind["receive_errors:ConnectionError"] >= 2


def test_prefetch_mode_reproduces_the_local_cache():
    release = threading.Event()
    broker, loop = pipeline(40, lambda m: release.wait(5), prefetch=1024, policy="round_robin")
    t = run_in_thread(loop)
    wait_until(lambda: loop.statistics().received == 40, what="everything prefetched")
    assert broker.backlog("G", "T") == 40  # received but unacked: invisible to other consumers
    release.set()
    wait_until(lambda: loop.statistics().acked == 40, what="all acked")
    loop.stop()
    t.join(10)


def key_of_body(m) -> str | None:
    body = m.body.decode()
    return body[0] if body.startswith("k") else None


@pytest.mark.parametrize("policy", [Aggressive(max_parked=1), RoundRobin(buffer=1), Random(buffer=1, seed=2)],
                         ids=["aggressive-parked-1", "round_robin-buffer-1", "random-buffer-1"])
def test_the_whole_batch_is_held_and_renewed_while_submit_cannot_take_it(policy):
    """Issue 11 item 1: k1 runs, k2 parks (or fills a buffer), k3 cannot be submitted; before the
    fix u4 behind it was neither held nor renewed, its lease ran out and it ran twice."""
    clock = Clock()
    release = threading.Event()
    runs: Counter[str] = Counter()
    lock = threading.Lock()

    def handler(m):
        with lock:
            runs[m.body.decode()] += 1
        release.wait(10)

    broker, loop = pipeline(0, handler, invisible=1, clock=clock, bodies=["k1", "k2", "k3", "u4"],
                            policy=policy, key=key_of_body, workers=4)
    t = run_in_thread(loop)
    wait_until(lambda: loop.statistics().received == 4, what="the batch of 4")
    for step in range(1, 4):  # three lease lengths, each renewed in time
        clock.advance(0.7)
        wait_until(lambda step=step: loop.statistics().leases_extended >= 4 * step, timeout=5,
                   what=f"all 4 leases renewed ({step})")
    release.set()
    wait_until(lambda: loop.statistics().acked == 4, what="4 acks")
    loop.stop()
    t.join(10)
    assert runs == {"k1": 1, "k2": 1, "k3": 1, "u4": 1}
    assert loop.statistics().ack_errors == 0 and loop.statistics().redelivered == 0 and broker.backlog("G", "T") == 0


def test_a_handled_message_waiting_for_its_ack_stays_renewed():
    """Before, a message left the renewal set when its handler ended; were the ack threads busy,
    its lease ran out in the ack queue and it came back."""
    clock = Clock()
    first_ack = threading.Event()
    stuck: list[bytes] = []
    runs: list[tuple[bytes, int]] = []

    class SlowFirstAck:
        def __init__(self, consumer):
            self.consumer = consumer

        def receive(self, n, invisible):
            return self.consumer.receive(n, invisible)

        def ack(self, m):
            if not stuck:
                stuck.append(m.body)
                first_ack.wait(10)  # the only ack thread is busy: the other outcome waits in the queue
            self.consumer.ack(m)

        def change_invisible_duration(self, m, s):
            self.consumer.change_invisible_duration(m, s)

    broker, loop = pipeline(2, lambda m: runs.append((m.body, m.delivery_attempt)), invisible=1, clock=clock,
                            ack_threads=1, consumer_wrapper=SlowFirstAck)
    t = run_in_thread(loop)
    wait_until(lambda: loop.statistics().succeeded == 2 and stuck, what="both handled, one ack stuck")
    for step in range(1, 3):  # two lease lengths
        clock.advance(0.7)
        wait_until(lambda step=step: loop.statistics().leases_extended >= step, timeout=5, what="the queued one renewed")
    first_ack.set()  # the stuck ack's own handle has expired meanwhile: that one comes back
    wait_until(lambda: loop.statistics().acked == 2, what="both acked")
    loop.stop()
    t.join(10)
    assert {body for body, attempt in runs if attempt > 1} <= set(stuck)
    assert sorted(body for body, attempt in runs if attempt == 1) == [b"0", b"1"]


def test_a_hung_handler_is_abandoned_after_timeout_plus_grace_and_stop_is_bounded():
    """Issue 11 item 6: before, the hung handler's lease was renewed forever (no peer could take
    the message) and stop() never returned. Now its lease is let go — by a TIMEOUT the dispatcher
    reports at the deadline (then given back with the retry backoff), or, should none come, by
    the loop itself after handler_timeout + hang_grace — and a second copy runs meanwhile."""
    clock = Clock()
    hang = threading.Event()
    attempts: list[int] = []

    def handler(m):
        attempts.append(m.delivery_attempt)
        if m.delivery_attempt == 1:
            hang.wait(30)

    broker, loop = pipeline(1, handler, invisible=1, clock=clock, workers=2, handler_timeout=1.0,
                            lease=LeaseOptions(invisible_duration=1, hang_grace=0.5),
                            retry_backoff=lambda attempt: 1)
    t = run_in_thread(loop)
    try:
        wait_until(lambda: attempts == [1], what="the first delivery runs")
        for _ in range(4):  # 2.8 s on the clock: renewed while young, then let go
            clock.advance(0.7)
            # a keeper pass on this very clock reading (the keeper thread's own passes come on
            # real-time ticks, maybe only after the next advance; a second pass changes nothing)
            loop.renew_leases()
        # renewed while young: at 1000.7 it is due and 0.7 s old; no TIMEOUT can have come yet
        wait_until(lambda: loop.statistics().leases_extended >= 1, what="the young lease renewed")
        wait_until(lambda: loop.statistics().abandoned + loop.statistics().retry_scheduled == 1, what="the hung one let go")
        clock.advance(1.0)  # its last lease (or the backoff) runs out: the broker hands it out again
        # ... but not to a second worker here while the hung call still runs: that copy is given
        # back at once (a healthy peer would take it), one copy of a message runs per process
        wait_until(lambda: loop.statistics().given_back == 1, what="the second delivery given back unrun")
        assert attempts == [1] and loop.statistics().redelivered == 1 and loop.statistics().not_started == 1
        # Bounded: run() returns although the hung call still runs. (stop's own True within
        # timeout + 0.5 s is real time, which a loaded machine did not always give it.)
        loop.stop(timeout=0.5)
        t.join(10)
        assert not t.is_alive(), "stop(timeout=) must not wait for a hung handler"
        assert not hang.is_set() and len(loop.dispatcher.running() + loop.dispatcher.overrun()) == 1  # it still runs
        assert loop.stop(timeout=0.5) is True  # and stop says so: nothing starts any more
        assert attempts == [1]
    finally:
        hang.set()
        t.join(10)


def test_a_renewal_refused_by_the_client_does_not_poison_the_ack():
    """The 5.1.2 client stores the refused answer's empty handle in message.receipt_handle."""
    clock = Clock()
    release = threading.Event()

    class BlankingClient:  # rocketmq-python-client 5.1.2's change_invisible_duration on an error
        def __init__(self, consumer):
            self.consumer, self.calls = consumer, 0

        def receive(self, n, invisible):
            return self.consumer.receive(n, invisible)

        def ack(self, m):
            self.consumer.ack(m)

        def change_invisible_duration(self, m, s):
            self.calls += 1
            if self.calls == 1:
                m.receipt_handle = ""
                raise RuntimeError("50001, INTERNAL_SERVER_ERROR")
            self.consumer.change_invisible_duration(m, s)

    broker, loop = pipeline(1, lambda m: release.wait(10), invisible=1, clock=clock, consumer_wrapper=BlankingClient)
    t = run_in_thread(loop)
    wait_until(lambda: loop.statistics().received == 1, what="received")
    clock.advance(0.7)
    wait_until(lambda: loop.statistics().leases_extended == 1, timeout=5, what="renewed after one refusal")
    release.set()
    wait_until(lambda: loop.statistics().acked + loop.statistics().ack_errors == 1, what="settled")
    loop.stop()
    t.join(10)
    assert loop.statistics().lease_errors == 1 and loop.statistics().acked == 1 and loop.statistics().ack_errors == 0


def test_a_lease_the_broker_refuses_is_a_loud_error():
    broker = EmbeddedBroker()  # the proxy's default minimum: 10 s
    consumer = SimpleConsumer(broker, "G", {"T": None}, await_duration=0)
    with pytest.raises(ValueError, match="below the broker's minimum receive invisible time"):
        ConsumeLoop(consumer, lambda m: None, invisible_duration=2)

    class Proxy:  # what the real client raises for a lease below minInvisibleTimeMillsForRecv
        def receive(self, n, invisible):
            raise RuntimeError("40011, the invisibleTime is too small. min is 10000")

    loop = ConsumeLoop(Proxy(), lambda m: None, invisible_duration=2, workers=1)
    with pytest.raises(LeaseRefused, match="minInvisibleTimeMillsForRecv"):
        loop.run(until=lambda s: s.receive_errors >= 2)


def test_options_groups_and_flat_keywords_configure_the_same_loop():
    broker = EmbeddedBroker()
    c = SimpleConsumer(broker, "G", {"T": None})
    a = ConsumeLoop(c, lambda m: None, workers=2, invisible_duration=40, max_batch=8, handler_timeout=5)
    b = ConsumeLoop(c, lambda m: None, dispatch=DispatchOptions(workers=2, handler_timeout=5),
                    lease=LeaseOptions(invisible_duration=40), flow=FlowOptions(max_batch=8))
    try:
        assert (a.dispatch_options, a.lease, a.flow) == (b.dispatch_options, b.lease, b.flow)
        assert a.dispatcher.workers == 2 and a.lease.margin == pytest.approx(40 / 3)
        for bad in ({"renew_margin": 30, "invisible_duration": 30}, {"invisible_duration": 43201},
                    {"max_batch": 33}, {"workers": 0}, {"ack_threads": 0}):
            with pytest.raises(ValueError):
                ConsumeLoop(c, lambda m: None, **bad)
        with Dispatcher(lambda m: None) as d, pytest.raises(TypeError):
            ConsumeLoop(c, lambda m: None, dispatcher=d)  # removed: it never acked
    finally:
        for loop in (a, b):  # never run: their dispatchers are closed here or never
            loop.dispatcher.close()


def test_a_message_the_dispatcher_refuses_does_not_stop_the_loop():
    """A key= callable that raises made submit raise and run() die (issue 11 item 2, loop side)."""
    def key(m):
        if m.body == b"3":
            raise ValueError("poison")
        return None

    broker, loop = pipeline(6, lambda m: None, key=key, retry_backoff=lambda attempt: 30)
    t = run_in_thread(loop)
    wait_until(lambda: loop.statistics().acked == 5, what="the other five acked")
    assert t.is_alive()
    loop.stop()
    t.join(10)
    s = loop.statistics()  # the poisoned one never ran: not started, given back, never a failure
    assert s.received == 6 and s.not_started + s.acked >= 6 and s.failed == 0


def test_stop_hands_out_the_backlog_and_acks_it():
    """What the dispatcher could not take yet when stop() came is still run and acked, not left
    for redelivery."""
    release = threading.Event()
    started = threading.Event()

    def handler(m):
        started.set()
        release.wait(10)

    broker, loop = pipeline(0, handler, bodies=["k1", "k2", "k3", "k4"], policy=Aggressive(max_parked=1),
                            key=key_of_body, workers=4)
    t = run_in_thread(loop)
    started.wait(5)
    wait_until(lambda: loop.state().waiting == 2, what="k3 and k4 in the backlog")
    assert loop.stop() is False
    release.set()
    t.join(10)
    assert not t.is_alive()
    assert loop.statistics().acked == 4 and loop.state().held == 0 and broker.backlog("G", "T") == 0


@pytest.mark.parametrize("then_run", [False, True], ids=["stopped", "stopped_then_run"])
def test_a_loop_stopped_before_it_ran_ends_its_workers_and_never_receives(then_run):
    """A loop built and stopped without run() left its dispatcher's worker threads alive (no run()
    would close them); the autouse leak check fails the test if any survives."""
    calls = []
    broker, loop = pipeline(3, lambda m: None, workers=3)
    receive = loop.consumer.receive
    loop.consumer.receive = lambda *a: calls.append(a) or receive(*a)
    workers = [t for t in threading.enumerate() if t.name.startswith("consume-dispatch")]
    assert len(workers) >= 3
    assert loop.stop() is True
    for t in workers:
        t.join(5)
    assert not any(t.is_alive() for t in workers)
    if then_run:
        stats = loop.run()
        assert stats.received == 0 and calls == []
        assert loop.run().received == 0 and calls == []  # again: still stopped, never receives
    assert loop.stop() is True  # a second stop: still stopped
