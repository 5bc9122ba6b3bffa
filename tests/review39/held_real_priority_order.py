"""The real 5.5 proxy: a send_job(priority_levels=8) job, its hand-out order, and its retries.

Promises (docs/dispatch.md "Longest first at the producer"): on a PRIORITY topic "every receive
takes from the highest queue that holds one, each queue in send order", so send_job(...,
priority_levels=N) is handed out "exactly longest first to whichever process asks"; "A message
that failed and comes back waits behind the topic's unconsumed messages". Checked here with the
shared proxy (services/rocketmq, minInvisibleTimeMillsForRecv 1 s), one fresh topic and group
per case: (a) one consumer receiving one at a time, (b) two consumers alternating, batches of 3,
(c) the longest received and given back (change_invisible_duration 1 s) waits behind the rest.
Exit 2 when the proxy is not there. Run only when no benchmark uses the proxy.
"""
from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))


def _open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


if not all(_open(p) for p in (9876, 10911, 8081)):
    print("no RocketMQ proxy on 127.0.0.1:8081")
    raise SystemExit(2)

import rmq_real  # noqa: E402

from tracer import MessageTracer, TracedProducer  # noqa: E402

N = 24
COSTS = {f"k{i:02d}": float((i * 7) % N) + 0.5 for i in range(N)}  # distinct, not sent in key order
EXPECTED = sorted(COSTS, key=lambda k: -COSTS[k])
problems: list[str] = []


def send_job(topic: str) -> None:
    producer = TracedProducer(rmq_real.start_producer(topic), MessageTracer())
    messages = [rmq_real.message(topic, k, keys=k) for k in COSTS]
    producer.send_job(messages, cost=lambda m: COSTS[min(m.keys)], priority_levels=8)
    rmq_real.quietly(producer.shutdown)


def drain(consumers: list, batch: int, expect: int, hold_first: bool = False) -> list[tuple[str, int]]:
    got: list[tuple[str, int]] = []
    deadline = time.monotonic() + 60
    turn = 0
    while len(got) < expect and time.monotonic() < deadline:
        c = consumers[turn % len(consumers)]
        turn += 1
        for m in c.receive(batch, 15) or []:
            key = m.body.decode()
            got.append((key, m.delivery_attempt))
            if hold_first and len(got) == 1:
                c.change_invisible_duration(m, 1)  # given back: returns in ~1 s (+ revive delay)
                time.sleep(4)  # real-time: the proxy revives the given-back one, the rest still unconsumed
                continue
            c.ack(m)
    return got


# (a) one consumer, one at a time
topic = rmq_real.fresh_topic("r39a", priority=True, queues=8)
group = rmq_real.fresh_group("r39a")
consumer = rmq_real.start_simple(group, topic)
send_job(topic)
order = [k for k, _ in drain([consumer], 1, N)]
if order != EXPECTED:
    problems.append(f"(a) one consumer: handed out {order}, sent {EXPECTED}")
rmq_real.quietly(consumer.shutdown)

# (b) two consumers alternating, batches of 3
topic = rmq_real.fresh_topic("r39b", priority=True, queues=8)
group = rmq_real.fresh_group("r39b")
consumers = [rmq_real.start_simple(group, topic) for _ in range(2)]
send_job(topic)
order = [k for k, _ in drain(consumers, 3, N)]
if order != EXPECTED:
    problems.append(f"(b) two consumers: handed out {order}, sent {EXPECTED}")
for c in consumers:
    rmq_real.quietly(c.shutdown)

# (c) a given-back message waits behind the unconsumed ones
topic = rmq_real.fresh_topic("r39c", priority=True, queues=8)
group = rmq_real.fresh_group("r39c")
consumer = rmq_real.start_simple(group, topic)
send_job(topic)
got = drain([consumer], 1, N + 1, hold_first=True)
firsts = [k for k, a in got if a == 1]
retry_at = [i for i, (k, a) in enumerate(got) if a > 1]
if firsts != EXPECTED:
    problems.append(f"(c) first deliveries {firsts}, sent {EXPECTED}")
if retry_at != [N]:
    problems.append(f"(c) the given-back {EXPECTED[0]} came back at positions {retry_at} of {len(got)}: {got}")
rmq_real.quietly(consumer.shutdown)

assert not problems, "\n  ".join(problems)
print("held")
