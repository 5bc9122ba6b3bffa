"""Helpers for the review30c scripts: a fault-free broker double on a manual clock, a watchdog."""
import os
import sys
import threading
import time
from types import SimpleNamespace

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

__all__ = ["Clock", "Double", "Slow", "consumer_of", "embedded", "fail", "msg", "run_in_thread", "until", "watchdog"]


def watchdog(seconds):
    """A hang is this script's failure: exit 3 after ``seconds``."""
    def bite():
        print(f"FAIL: still running after {seconds} s", flush=True)
        os._exit(3)
    t = threading.Timer(seconds, bite)
    t.daemon = True
    t.start()


def fail(why):
    print("FAIL:", why, flush=True)
    os._exit(1)


class Clock:
    """A manual seconds clock; the receive double advances it by one round trip."""
    def __init__(self, t=1000.0):
        self.t = t
        self.lock = threading.Lock()

    def __call__(self):
        with self.lock:
            return self.t

    def advance(self, s):
        with self.lock:
            self.t += s


def msg(i, key=None, cost=None):
    props = {} if cost is None else {"rmqtrace_cost": cost}
    return SimpleNamespace(message_id=f"m{i}", receipt_handle=None, properties=props, message_group=key,
                           delivery_attempt=1, topic="t", tag=None, keys=[], body=b"x")


class Double:
    """A SimpleConsumer double: hands out ``queue`` in order, one round trip of ``trip`` s on ``clock``."""
    consumer_group = "g-review30c"

    def __init__(self, queue, clock=None, trip=0.01):
        self.queue = list(queue)
        self.clock, self.trip = clock, trip
        self.lock = threading.Lock()
        self.received, self.acked, self.nacked, self.renewed = [], [], [], []

    def receive(self, n, invisible):
        with self.lock:
            got, self.queue = self.queue[:n], self.queue[n:]
            self.received.extend(got)
        if self.clock is not None:
            trip = self.trip
            if isinstance(trip, list):  # a sequence of round trips, the last one repeated
                trip = trip.pop(0) if len(trip) > 1 else trip[0]
            self.clock.advance(trip)
        return got

    def ack(self, m):
        with self.lock:
            self.acked.append(m.message_id)

    def change_invisible_duration(self, m, seconds):
        with self.lock:
            (self.renewed if seconds > 5 else self.nacked).append(m.message_id)


def run_in_thread(loop, **kw):
    box = {}
    def go():
        try:
            box["stats"] = loop.run(**kw)
        except BaseException as exc:  # noqa: BLE001
            box["exc"] = exc
    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t, box


def until(pred, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.005)  # real-time: the poll's interval (a deadline bounds it)
    return pred()


def embedded(n=0, cost=None, key=None, group="g-review30c", min_invisible=1, topic="t30c"):
    """An embedded broker with ``n`` messages (each with ``cost`` as its rmqtrace_cost) and a
    started consumer of ``group`` on it."""
    from tracer.embedded import EmbeddedBroker, Message, Producer, SimpleConsumer
    b = EmbeddedBroker(min_receive_invisible=min_invisible)
    p = Producer(b)
    p.startup()
    for i in range(n):
        m = Message()
        m.topic, m.body = topic, f"b{i}".encode()
        if key is not None:
            m.message_group = key
        if cost is not None:
            m.add_property("rmqtrace_cost", cost)
        p.send(m)
    return b, consumer_of(b, group, topic)


def consumer_of(b, group="g-review30c", topic="t30c", await_duration=0.2):
    from tracer.embedded import SimpleConsumer
    c = SimpleConsumer(b, group, {topic: None}, await_duration=await_duration)
    c.startup()
    return c


class Slow:
    """A consumer whose receive takes ``seconds`` more (a slow broker): receive_ahead's lead grows."""
    def __init__(self, inner, seconds):
        self._inner, self._s = inner, seconds

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def receive(self, n, invisible):
        time.sleep(self._s)  # real-time: a slow broker: each receive takes this long
        return self._inner.receive(n, invisible)
