import threading

from waiting import wait_until

from tracer.clients.consume import ConsumeLoop
from tracer.embedded import EmbeddedBroker, Message, Producer, SimpleConsumer
from tracer.telemetry.metrics import TracerMetrics
from tracer.clients.producer import TracedProducer
from tracer.path.stages import Stage
from tracer.telemetry.tracer import MessageTracer


def pipeline(n: int, handler, *, invisible: float = 30.0, tracer=None, producer_tracer=None, **kw):
    broker = EmbeddedBroker()
    broker.create_topic("T")
    producer = Producer(broker, ["T"])
    producer.startup()
    if producer_tracer is not None:
        producer = TracedProducer(producer, producer_tracer)
    for i in range(n):
        m = Message()
        m.topic, m.body = "T", f"{i}".encode()
        producer.send(m)
    consumer = SimpleConsumer(broker, "G", {"T": None}, await_duration=0.05)
    consumer.startup()
    loop = ConsumeLoop(consumer, handler, tracer=tracer, invisible_duration=invisible, workers=4, **kw)
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
    wait_until(lambda: loop.stats.acked == 50, what="50 acks")
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
    wait_until(lambda: loop.stats.acked == 1, what="ack after retry")
    loop.stop()
    t.join(10)
    assert attempts == [1, 2]
    assert loop.stats.failed == 1 and loop.stats.retry_scheduled == 1 and loop.stats.redelivered == 1


def test_long_handler_keeps_its_lease_and_is_not_redelivered():
    release = threading.Event()
    deliveries = []

    def handler(m):
        deliveries.append(m.delivery_attempt)
        release.wait(5)

    broker, loop = pipeline(1, handler, invisible=0.3, renew_margin=0.2)
    t = run_in_thread(loop)
    wait_until(lambda: loop.stats.leases_extended >= 4, what="lease renewals past the first lease")
    release.set()
    wait_until(lambda: loop.stats.acked == 1, what="ack")
    loop.stop()
    t.join(10)
    assert deliveries == [1]
    assert loop.stats.ack_errors == 0


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
    assert loop.stats.acked == loop.stats.received and loop.stats.received >= 1
    assert broker.backlog("G", "T") == 4 - loop.stats.acked


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
    wait_until(lambda: loop.stats.receive_errors >= 2, what="two receive errors")
    loop.stop()
    t.join(10)
    assert loop.stats.errors_by_kind["receive_errors:ConnectionError"] >= 2


def test_prefetch_mode_reproduces_the_local_cache():
    release = threading.Event()
    broker, loop = pipeline(40, lambda m: release.wait(5), prefetch=1024, policy="round_robin")
    t = run_in_thread(loop)
    wait_until(lambda: loop.stats.received == 40, what="everything prefetched")
    assert broker.backlog("G", "T") == 40  # received but unacked: invisible to other consumers
    release.set()
    wait_until(lambda: loop.stats.acked == 40, what="all acked")
    loop.stop()
    t.join(10)
