"""Finding 02 on the real RocketMQ 5 proxy (services/rocketmq, FIFO topic with one queue, FIFO
consumer group): the promise is the same — on a FIFO topic with ``key=`` the message group, no
message of a group starts before every earlier one has succeeded, each later one runs once.

Steps: send a0 a1 a2 a3 (group "a"); a ConsumeLoop (aggressive, 2 workers) whose ``key=`` raises
for a1 on its first delivery only.

Expected: a0 a1 a2 a3, each once.
Actual: a1 alone is given back; a2 and a3 run before a1 has run (a2 at least), then the proxy
hands the queue out again from a1 and a2, a3 run a second time.
Needs the shared services (``bash services/rocketmq/rmq.sh status``); exits 2 if unreachable.
"""
import os
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/: rmq_real
import rmq_real  # noqa: E402

from tracer import ConsumeLoop  # noqa: E402

if not all(rmq_real._port_open(p) for p in rmq_real.PORTS):
    print("the real proxy is not up", file=sys.stderr)
    sys.exit(2)

topic = rmq_real.fresh_topic("r38fifo", fifo=True, queues=1)
group = rmq_real.fresh_group("r38g", fifo=True)
consumer = rmq_real.start_simple(group, topic)
producer = rmq_real.start_producer(topic)
for i in range(4):
    producer.send(rmq_real.message(topic, f"a{i}", group="a"))
producer.shutdown()

lock, starts, ok = threading.Lock(), [], set()


def key(m):
    if m.body == b"a1" and m.delivery_attempt == 1:
        raise RuntimeError("key= broke on a1")
    return m.message_group


def handler(m):
    with lock:
        starts.append(m.body.decode())
        ok.add(m.body)


loop = ConsumeLoop(consumer, handler, key=key, workers=2, invisible_duration=20, retry_backoff=lambda a: 1)
t = threading.Thread(target=lambda: loop.run(until=lambda s: len(ok) >= 4 and s.held == 0), daemon=True)
t.start()
t.join(90)
if t.is_alive():
    loop.stop(timeout=5)
    t.join(10)
rmq_real.quietly(consumer.shutdown)
print("starts", starts, loop.statistics())
assert starts == ["a0", "a1", "a2", "a3"], f"group a ran out of order / twice on the proxy: {starts}"
