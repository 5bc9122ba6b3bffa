"""Smoke test of the local RocketMQ 5.x (services/rocketmq/rmq.sh) with the official gRPC Python
client `rocketmq-python-client` 5.1.2 (import name `rocketmq`).

    python3 -m venv /tmp/rmqv && /tmp/rmqv/bin/pip install rocketmq-python-client==5.1.2
    services/rocketmq/rmq.sh start
    /tmp/rmqv/bin/python services/rocketmq/smoke.py            # all checks
    /tmp/rmqv/bin/python services/rocketmq/smoke.py normal push  # some of them

Checks: send with tag/keys/properties + SimpleConsumer receive/ack (prints every field and timestamp),
long-polling block time, redelivery of an un-acked message (delivery_attempt 2),
change_invisible_duration (receipt handle replaced in place), FIFO topic + FIFO group ordering,
PushConsumer with a MessageListener (threads, bug #1191 with metricCollectorMode=off).
Exit status 0 when every selected check passed.
"""

import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import rmq_admin  # noqa: E402  (stdlib-only topic/group creation, a few ms)

RMQ_SH = os.path.join(HERE, "rmq.sh")
ENDPOINT = os.environ.get("RMQ_GRPC_ENDPOINT", "127.0.0.1:8081")
# Every check uses its own new topic (rmq_admin: a few ms): a NEW consumer group starts at the
# beginning of the queues (messages still in the store), so shared topics hand old messages to it.

# --- import side effects of the client ------------------------------------------------------
# rocketmq/v5/log/log_config.py runs at import time: os.makedirs(expanduser("~/logs/rocketmq_python/"))
# and logging.config.dictConfig(...) adding a RotatingFileHandler (opened at once, DEBUG handler,
# logger "rocketmq-python-client" at INFO, propagate=False). Point HOME at a scratch dir for the
# import, then replace the file handler.
_log_home = tempfile.mkdtemp(prefix="rmq-pylog-")
_old_home = os.environ.get("HOME")
os.environ["HOME"] = _log_home
try:
    from rocketmq import (  # noqa: E402
        ClientConfiguration,
        ConsumeResult,
        Credentials,
        FilterExpression,
        Message,
        MessageListener,
        Producer,
        PushConsumer,
        SimpleConsumer,
    )
finally:
    if _old_home is None:
        del os.environ["HOME"]
    else:
        os.environ["HOME"] = _old_home


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


_client_log = logging.getLogger("rocketmq-python-client")
for _h in list(_client_log.handlers):
    _client_log.removeHandler(_h)
    _h.close()
CAPTURE = _Capture()
_client_log.addHandler(CAPTURE)
_client_log.setLevel(logging.INFO)


def client_errors(since=0):
    return [f"{r.levelname} {r.getMessage()}" for r in CAPTURE.records[since:] if r.levelno >= logging.WARNING]


RUN = uuid.uuid4().hex[:8]


def fresh_topic(name, fifo=False):
    t = f"smoke-{name}-{RUN}"
    t0 = time.monotonic()
    rmq_admin.create_topic(t, fifo=fifo)
    print(f"  topic {t} ({'FIFO' if fifo else 'NORMAL'}) created in {1000 * (time.monotonic() - t0):.0f} ms")
    return t


def now_ms():
    return time.time_ns() // 1_000_000


def cfg():
    return ClientConfiguration(ENDPOINT, Credentials())


def rmq(*args):
    t0 = time.monotonic()
    subprocess.run([RMQ_SH, *args], check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - t0


def store_ts(m):
    # parsed from system_properties.store_timestamp but not exposed as a property in 5.1.2
    return m._Message__store_timestamp


def describe(m):
    return {
        "message_id": m.message_id,
        "topic": m.topic,
        "tag": m.tag,
        "keys": sorted(m.keys),
        "properties": dict(m.properties),
        "message_group": m.message_group,
        "message_type": Message.message_type_desc(m.message_type),
        "delivery_attempt": m.delivery_attempt,
        "born_host": m.born_host,
        "born_timestamp": m.born_timestamp,
        "store_timestamp": store_ts(m),
        "transport_delivery_timestamp": m.transport_delivery_timestamp,
        "decode_message_timestamp": m.decode_message_timestamp,
        "receipt_handle": (m.receipt_handle[:24] + "...") if m.receipt_handle else None,
        "body": m.body,
    }


def make_msg(topic, i, tag="smoke", group=None, **props):
    m = Message()
    m.topic = topic
    m.body = f"{RUN}-{i}".encode()
    m.tag = tag
    m.keys = f"key-{RUN}-{i}"  # the setter ADDS one key per assignment (keys is a set)
    m.add_property("run", RUN)
    m.add_property("seq", str(i))
    m.add_property("sent_ms", str(now_ms()))
    for k, v in props.items():
        m.add_property(k, v)
    if group:
        m.message_group = group
    return m


def start_producer(topics):
    p = Producer(cfg(), tuple(topics))
    t0 = time.monotonic()
    p.startup()
    print(f"  producer.startup: {time.monotonic() - t0:.2f}s")
    return p


def start_simple(group, topic, await_duration=2, fifo_group=False):
    # RocketMQ 5.5's proxy refuses the telemetry Settings of an unknown group ("group not found"),
    # even with autoCreateSubscriptionGroup=true: create the group first.
    rmq_admin.create_group(group, fifo=fifo_group)
    c = SimpleConsumer(cfg(), group, {topic: FilterExpression()}, await_duration=await_duration)
    t0 = time.monotonic()
    c.startup()
    t1 = time.monotonic()
    # SimpleConsumer.startup() does not wait for the proxy's answer to the telemetry Settings; a
    # receive() before it fails with INTERNAL_SERVER_ERROR 50001 (proxy NPE: settings is null).
    # reset_setting() sets _init_settings_event when that answer arrives.
    ok = c._init_settings_event.wait(10)
    print(f"  simple consumer startup: {t1 - t0:.2f}s + settings sync {time.monotonic() - t1:.2f}s "
          f"(ok={ok}, await_duration={await_duration}s)")
    return c


def receive_mine(consumer, want, invisible=10, deadline_s=30, ack=True, max_num=16):
    """receive until `want` messages of this run arrived; foreign messages are acked and skipped"""
    got = []
    end = time.monotonic() + deadline_s
    while len(got) < want and time.monotonic() < end:
        for m in consumer.receive(max_num, invisible):
            if m.properties.get("run") != RUN:
                consumer.ack(m)
                continue
            got.append(m)
            if ack:
                consumer.ack(m)
    return got


# ------------------------------------------------------------------------------------------ checks
def check_normal():
    print("== normal topic: send with tag/keys/properties, SimpleConsumer receive + ack")
    group = f"smoke-normal-{RUN}"
    TOPIC = fresh_topic("normal")
    c = start_simple(group, TOPIC, await_duration=2)
    # a first (empty) receive: shows the long-polling block time and initialises the group's offset
    t0 = time.monotonic()
    first = c.receive(16, 10)
    print(f"  empty receive blocked {time.monotonic() - t0:.2f}s with await_duration=2 "
          f"(got {len(first)} old messages)")
    for m in first:
        c.ack(m)
    p = start_producer([TOPIC])
    n = 5
    for i in range(n):
        m = make_msg(TOPIC, i)
        t0 = time.monotonic()
        r = p.send(m)
        print(f"  sent {i}: receipt.message_id={r.message_id} (msg.message_id={m.message_id}) "
              f"queue={r.message_queue} offset={r.offset} in {1000 * (time.monotonic() - t0):.1f} ms")
    got = receive_mine(c, n)
    for m in got:
        d = describe(m)
        print(f"  received: {d}")
        sent = int(m.properties["sent_ms"])
        print(f"    store-sent={d['store_timestamp'] - sent} ms  transport-store="
              f"{d['transport_delivery_timestamp'] - d['store_timestamp']} ms  decode-transport="
              f"{d['decode_message_timestamp'] - d['transport_delivery_timestamp']} ms  "
              f"born%1000={d['born_timestamp'] % 1000}")
    assert len(got) == n, f"received {len(got)} of {n}"
    assert all(m.delivery_attempt == 1 for m in got)
    assert all(m.tag == "smoke" and m.properties["run"] == RUN for m in got)
    assert all(store_ts(m) and m.transport_delivery_timestamp and m.decode_message_timestamp for m in got)
    # receive with nothing left: blocks about await_duration
    t0 = time.monotonic()
    rest = c.receive(16, 10)
    print(f"  empty receive blocked {time.monotonic() - t0:.2f}s, got {len(rest)}")
    c.shutdown()
    p.shutdown()


def check_redelivery():
    print("== redelivery: receive, do not ack, wait for invisible_duration")
    group = f"smoke-redeliver-{RUN}"
    TOPIC = fresh_topic("redeliver")
    c = start_simple(group, TOPIC, await_duration=1)
    for m in c.receive(16, 10):
        c.ack(m)
    p = start_producer([TOPIC])
    p.send(make_msg(TOPIC, 100, tag="redeliver"))
    first = receive_mine(c, 1, invisible=2, ack=False)
    assert len(first) == 1
    m1 = first[0]
    t_recv = time.monotonic()
    print(f"  1st: id={m1.message_id} attempt={m1.delivery_attempt} handle={m1.receipt_handle[:24]}...")
    again = receive_mine(c, 1, invisible=10, ack=False, deadline_s=60)
    assert len(again) == 1
    m2 = again[0]
    print(f"  2nd after {time.monotonic() - t_recv:.2f}s (invisible_duration=2s): id={m2.message_id} "
          f"attempt={m2.delivery_attempt} same_id={m2.message_id == m1.message_id} "
          f"new_handle={m2.receipt_handle != m1.receipt_handle} store_ts_same={store_ts(m2) == store_ts(m1)} "
          f"props_same={m2.properties == m1.properties}")
    assert m2.message_id == m1.message_id and m2.delivery_attempt == 2
    c.ack(m2)
    # ack with the stale receipt handle of the first delivery
    try:
        c.ack(m1)
        print("  ack with the stale (1st delivery) receipt handle: accepted")
    except Exception as e:  # noqa: BLE001
        print(f"  ack with the stale (1st delivery) receipt handle: {type(e).__name__}: {e}")
    c.shutdown()
    p.shutdown()


def check_change_invisible():
    print("== change_invisible_duration")
    group = f"smoke-chinv-{RUN}"
    TOPIC = fresh_topic("chinv")
    c = start_simple(group, TOPIC, await_duration=1)
    for m in c.receive(16, 10):
        c.ack(m)
    p = start_producer([TOPIC])
    p.send(make_msg(TOPIC, 200, tag="chinv"))
    got = receive_mine(c, 1, invisible=2, ack=False)
    assert len(got) == 1
    m = got[0]
    old = m.receipt_handle
    t0 = time.monotonic()
    ret = c.change_invisible_duration(m, 6)
    print(f"  change_invisible_duration(msg, 6) returned {ret!r} in {1000 * (time.monotonic() - t0):.1f} ms; "
          f"msg.receipt_handle replaced in place: {m.receipt_handle != old}")
    assert m.receipt_handle != old
    # the original 2 s passes: must not come back before 6 s
    t1 = time.monotonic()
    seen = receive_mine(c, 1, invisible=10, ack=False, deadline_s=3.5)
    print(f"  receive during the extended invisibility ({time.monotonic() - t1:.1f}s): {len(seen)} message(s)")
    assert not seen
    # stale handle after the change
    stale = Message()
    stale.topic = m.topic
    stale.message_id = m.message_id
    stale.receipt_handle = old
    stale.endpoints = m.endpoints
    try:
        c.ack(stale)
        print("  ack with the OLD handle after change_invisible_duration: accepted")
    except Exception as e:  # noqa: BLE001
        print(f"  ack with the OLD handle after change_invisible_duration: {type(e).__name__}: {e}")
    c.ack(m)
    print("  ack with the new handle: ok")
    # does it come back? (it must not after a successful ack)
    back = receive_mine(c, 1, invisible=10, ack=True, deadline_s=8)
    print(f"  after ack, redelivered within 8 s: {len(back)} (attempts {[x.delivery_attempt for x in back]})")
    c.shutdown()
    p.shutdown()


def check_fifo():
    print("== FIFO topic + FIFO consumer group")
    group = f"smoke-fifo-{RUN}"
    FIFO_TOPIC = fresh_topic("fifo", fifo=True)
    took = rmq("group", group, "fifo")
    print(f"  rmq.sh group {group} fifo: {took:.2f}s")
    c = start_simple(group, FIFO_TOPIC, await_duration=1, fifo_group=True)
    for m in c.receive(16, 10):
        c.ack(m)
    p = start_producer([FIFO_TOPIC])
    groups = ["g-a", "g-b"]
    per = 5
    for i in range(per):
        for g in groups:
            p.send(make_msg(FIFO_TOPIC, i, tag="fifo", group=g, mg=g))
    order = {g: [] for g in groups}
    batches = []
    end = time.monotonic() + 40
    while sum(map(len, order.values())) < per * len(groups) and time.monotonic() < end:
        batch = [m for m in c.receive(16, 10) if m.properties.get("run") == RUN or c.ack(m)]
        if batch:
            batches.append([(m.message_group, int(m.properties["seq"]), m.message_type) for m in batch])
        for m in batch:
            order[m.message_group].append(int(m.properties["seq"]))
            c.ack(m)
    print(f"  batches (group, seq, type): {batches}")
    print(f"  order per message_group: {order}")
    assert all(order[g] == list(range(per)) for g in groups), order
    # Same FIFO topic with a NON-fifo group: no ordering guarantee, just show it works
    c.shutdown()
    p.shutdown()


def patch_push_consumer_metrics_bug():
    """rocketmq-clients #1191 workaround: with the proxy's metricCollectorMode=off the Settings carry
    metric.on=false, ClientMetrics keeps no meter provider, and PushConsumer.reset_metric() then calls
    create_push_consumer_process_queue_observable_gauge() -> AttributeError 'NoneType' object has no
    attribute 'get_meter'. That exception ends the telemetry read loop (logged as ERROR "read stream
    from endpoints ... exception"); consumption itself goes on. Register the gauges only when on."""
    from rocketmq.v5.consumer.consumer import Consumer

    def reset_metric(self, metric):
        Consumer.reset_metric(self, metric)  # -> Client.reset_metric -> ClientMetrics.reset_metrics
        if metric.on:
            self._PushConsumer__register_process_queues_gauges()

    PushConsumer.reset_metric = reset_metric


class Listener(MessageListener):
    def __init__(self):
        self.got = []
        self.threads = set()
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.want = 0
        self.tag = "push"

    def consume(self, message):
        with self.lock:
            if message.properties.get("run") == RUN and message.tag == self.tag:
                self.got.append((now_ms(), message))
                self.threads.add(threading.current_thread().name)
                if len(self.got) >= self.want:
                    self.done.set()
        return ConsumeResult.SUCCESS


def check_push(patched=False):
    print(f"== PushConsumer with a MessageListener (proxy metricCollectorMode=off, #1191 patch={patched})")
    if patched:
        patch_push_consumer_metrics_bug()
    mark = len(CAPTURE.records)
    group = f"smoke-push-{'p' if patched else 'u'}-{RUN}"
    TOPIC = fresh_topic("push-p" if patched else "push")
    lst = Listener()
    lst.tag = "pushp" if patched else "push"
    lst.want = 20
    rmq_admin.create_group(group)
    pc = PushConsumer(cfg(), group, lst, {TOPIC: FilterExpression()}, consumption_thread_count=4)
    t0 = time.monotonic()
    pc.startup()
    print(f"  push consumer startup: {time.monotonic() - t0:.2f}s; fifo={pc.fifo} "
          f"receive_batch_size={pc.receive_batch_size} long_polling_timeout={pc.long_polling_timeout}s")
    time.sleep(2)  # let it query its assignment and start long polling
    p = start_producer([TOPIC])
    sent = {}
    for i in range(lst.want):
        m = make_msg(TOPIC, 300 + i, tag=lst.tag)
        sent[str(300 + i)] = now_ms()
        p.send(m)
    ok = lst.done.wait(30)
    print(f"  listener got {len(lst.got)}/{lst.want} (ok={ok}); consumer threads used: {sorted(lst.threads)}")
    lat = sorted(t - sent[m.properties["seq"]] for t, m in lst.got)
    if lat:
        print(f"  send->listener latency ms: min={lat[0]} median={lat[len(lat) // 2]} max={lat[-1]}")
    wait = sorted(t - m.decode_message_timestamp for t, m in lst.got)
    if wait:
        print(f"  decode->listener (executor queue wait) ms: min={wait[0]} max={wait[-1]}; "
              f"attempts={sorted({m.delivery_attempt for _, m in lst.got})}")
    cid = pc.client_id
    names = sorted(t.name.replace(cid, "<client_id>") for t in threading.enumerate())
    print(f"  python threads now: {len(names)}: {names}")
    errs = client_errors(mark)
    print(f"  client log warnings/errors since start: {errs[:5]}")
    pc.shutdown()
    p.shutdown()
    assert ok, "push consumer did not receive every message"
    if patched:
        assert not [e for e in errs if "get_meter" in e], errs


def check_push_fifo():
    print("== PushConsumer on the FIFO topic with a FIFO group")
    group = f"smoke-pushfifo-{RUN}"
    FIFO_TOPIC = fresh_topic("pushfifo", fifo=True)
    rmq_admin.create_group(group, fifo=True)
    lst = Listener()
    lst.tag = "pushfifo"
    lst.want = 10
    pc = PushConsumer(cfg(), group, lst, {FIFO_TOPIC: FilterExpression()}, consumption_thread_count=4)
    pc.startup()
    print(f"  push consumer fifo={pc.fifo}")
    time.sleep(2)
    p = start_producer([FIFO_TOPIC])
    for i in range(5):
        for g in ("pa", "pb"):
            p.send(make_msg(FIFO_TOPIC, i, tag="pushfifo", group=g))
    ok = lst.done.wait(30)
    order = {}
    for _, m in lst.got:
        order.setdefault(m.message_group, []).append(int(m.properties["seq"]))
    print(f"  got {len(lst.got)} ok={ok} order={order} threads={len(lst.threads)}")
    pc.shutdown()
    p.shutdown()
    assert ok and pc.fifo and all(v == list(range(5)) for v in order.values()), order


CHECKS = {
    "normal": check_normal,
    "redelivery": check_redelivery,
    "chinv": check_change_invisible,
    "fifo": check_fifo,
    "push": check_push,
    "push-patched": lambda: check_push(patched=True),
    "push-fifo": check_push_fifo,
}


def main(argv):
    names = argv or list(CHECKS)
    failed = []
    for name in names:
        t0 = time.monotonic()
        try:
            CHECKS[name]()
            print(f"-- {name}: PASSED in {time.monotonic() - t0:.1f}s\n")
        except Exception as e:  # noqa: BLE001
            failed.append(name)
            print(f"-- {name}: FAILED {type(e).__name__}: {e}\n")
    print(f"client log dir created at import: {os.listdir(_log_home)} under scratch HOME {_log_home}")
    print(f"{len(names) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
