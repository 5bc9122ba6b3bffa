"""Smoke test of the local RocketMQ (services/rocketmq/rmq.sh) with the LEGACY Python client
rocketmq-client-python 2.0.0 (ctypes over rocketmq-client-cpp's librocketmq.so; remoting protocol:
name server 127.0.0.1:9876, then the broker 127.0.0.1:10911 directly, not the gRPC proxy).

    python3 -m venv /tmp/rmql && services/rocketmq/install_legacy_client.sh /tmp/rmql/bin/python
    services/rocketmq/rmq.sh start
    /tmp/rmql/bin/python services/rocketmq/smoke_legacy.py [--retry]

Sends N messages with keys/tags/properties via Producer.send_sync, receives them with
PushConsumer.subscribe(topic, callback) and prints every attribute of the received messages.
--retry: the callback returns RECONSUME_LATER once for one message and waits for its redelivery
(reconsume_times 1, ~10 s: the broker's retry delay level 3).
--no-trace-fix: do not apply enable_consumer_trace() (then PushConsumer.shutdown() segfaults).
"""

import os
import sys
import tempfile
import threading
import time
import uuid

# librocketmq.so writes its log to $ROCKETMQ_CLIENT_LOG_DIR (default ~/logs/rocketmq-cpp/)
LOG_DIR = os.environ.setdefault("ROCKETMQ_CLIENT_LOG_DIR", tempfile.mkdtemp(prefix="rmq-cpplog-"))

import ctypes  # noqa: E402

from rocketmq.client import ConsumeStatus, Message, Producer, PushConsumer  # noqa: E402
from rocketmq.ffi import dll  # noqa: E402


def enable_consumer_trace(consumer):
    """Workaround for a crash of librocketmq.so 2.1.0 (rocketmq-python-cvs): PushConsumer.shutdown()
    -> DefaultMQPushConsumerImpl::shutdownMessageTraceInnerProducer() dereferences the message-trace
    inner producer unconditionally; it exists only when message trace is on, which is off by default
    -> SIGSEGV. Turning trace on (C API SetPushConsumerMessageTrace(consumer, OPEN=0), not wrapped by
    rocketmq-client-python 2.0.0) before start() avoids it. Trace data then goes to the broker's
    RMQ_SYS_TRACE_TOPIC (auto-created, autoCreateTopicEnable=true)."""
    dll.SetPushConsumerMessageTrace.argtypes = [ctypes.c_void_p, ctypes.c_int]
    dll.SetPushConsumerMessageTrace.restype = ctypes.c_int
    rc = dll.SetPushConsumerMessageTrace(consumer._handle, 0)
    if rc != 0:
        raise RuntimeError(f"SetPushConsumerMessageTrace: {rc}")

NAMESRV = os.environ.get("RMQ_NAMESRV", "127.0.0.1:9876")
TOPIC = os.environ.get("RMQ_TOPIC", "rmqtrace-test")
RUN = uuid.uuid4().hex[:8]
N = 5


def now_ms():
    return time.time_ns() // 1_000_000


ATTRS = ["id", "topic", "tags", "keys", "body", "queue_id", "queue_offset", "reconsume_times",
         "store_size", "born_timestamp", "store_timestamp", "commit_log_offset",
         "prepared_transaction_offset", "delay_time_level"]
PROPS = ["run", "seq", "sent_ms", "UNIQ_KEY", "KEYS", "TAGS", "CONSUME_START_TIME", "RECONSUME_TIME",
         "MAX_RECONSUME_TIMES", "RETRY_TOPIC", "ORIGIN_MESSAGE_ID", "REAL_TOPIC", "WAIT", "MSG_REGION",
         "TRACE_ON"]


def main(argv):
    retry = "--retry" in argv
    got = []
    seen_threads = set()
    lock = threading.Lock()
    done = threading.Event()
    refused = set()
    want = N + (1 if retry else 0)

    def on_message(msg):
        t = now_ms()
        # bytes: tags, keys, body, get_property(); str: id, topic
        if msg.get_property("run") != RUN.encode():
            return ConsumeStatus.CONSUME_SUCCESS
        rec = {a: getattr(msg, a) for a in ATTRS}
        rec["props"] = {p: msg.get_property(p) for p in PROPS}
        rec["recv_ms"] = t
        with lock:
            seen_threads.add(threading.current_thread().name + "/" + str(threading.get_ident()))
            got.append(rec)
            if retry and rec["props"]["seq"] == b"0" and "0" not in refused:
                refused.add("0")
                return ConsumeStatus.RECONSUME_LATER
            if len(got) >= want:
                done.set()
        return ConsumeStatus.CONSUME_SUCCESS

    group = f"legacy-c-{RUN}"
    consumer = PushConsumer(group)
    consumer.set_name_server_address(NAMESRV)
    consumer.set_thread_count(2)
    if "--no-trace-fix" not in argv:
        enable_consumer_trace(consumer)
    consumer.subscribe(TOPIC, on_message)  # expression defaults to '*'
    t0 = time.monotonic()
    consumer.start()
    print(f"push consumer {group} started in {time.monotonic() - t0:.2f}s")

    producer = Producer(f"legacy-p-{RUN}")
    producer.set_name_server_address(NAMESRV)
    t0 = time.monotonic()
    producer.start()
    print(f"producer started in {time.monotonic() - t0:.2f}s")
    time.sleep(1)
    for i in range(N):
        m = Message(TOPIC)
        m.set_keys(f"key-{RUN}-{i}")
        m.set_tags("legacy")
        m.set_body(f"{RUN}-{i}")
        m.set_property("run", RUN)
        m.set_property("seq", str(i))
        m.set_property("sent_ms", str(now_ms()))
        t0 = time.monotonic()
        r = producer.send_sync(m)
        print(f"sent {i}: status={r.status.name} msg_id={r.msg_id} offset={r.offset} "
              f"in {1000 * (time.monotonic() - t0):.1f} ms")

    ok = done.wait(60 if retry else 30)
    for rec in got:
        print(f"received: {rec}")
        sent = int(rec["props"]["sent_ms"])
        print(f"  store-sent={rec['store_timestamp'] - sent} ms  born-sent={rec['born_timestamp'] - sent} ms  "
              f"recv-store={rec['recv_ms'] - rec['store_timestamp']} ms")
    print(f"callback threads: {sorted(seen_threads)}")
    t0 = time.monotonic()
    consumer.shutdown()
    producer.shutdown()
    print(f"shutdown (consumer, then producer) in {time.monotonic() - t0:.2f}s")
    print(f"client log dir {LOG_DIR}: {os.listdir(LOG_DIR)}")
    firsts = [r for r in got if r["reconsume_times"] == 0]
    ok = ok and len({r["props"]["seq"] for r in firsts}) == N
    if retry:
        again = [r for r in got if r["reconsume_times"] >= 1]
        summary = [(r["props"]["seq"], r["reconsume_times"], r["id"], r["topic"]) for r in again]
        print(f"redelivered after RECONSUME_LATER: {summary}")
        ok = ok and len(again) == 1
    print(f"{1 if ok else 0} passed, {0 if ok else 1} failed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
