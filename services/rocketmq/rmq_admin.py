"""Fast topic / consumer-group administration for the local RocketMQ (stdlib only, no JVM).

Speaks RocketMQ's remoting protocol (the one MQAdminStartup uses) directly to the broker and the
name server, so a topic or group is created in a few ms instead of ~2.5 s of JVM startup.

    python3 services/rocketmq/rmq_admin.py topic NAME... [fifo|priority] [--queues N]
    python3 services/rocketmq/rmq_admin.py group NAME... [fifo]

    from rmq_admin import create_topic, create_group
    create_topic("t-123")                 # NORMAL topic, 4 queues, route visible when it returns
    create_topic("t-fifo", fifo=True)     # attribute +message.type=FIFO
    create_topic("t-prio", priority=True, queues=8)  # +message.type=PRIORITY: 8 priority levels
    create_group("g-123")                 # consumer group (RocketMQ 5.5 proxies reject unknown groups)
    create_group("g-fifo", fifo=True)     # consumeMessageOrderly=true: FIFO delivery to gRPC consumers

Frame format: int32 total length (4 + header + body), int32 header length (high byte 0 = JSON
serialization), JSON header {code, language, version, opaque, flag, extFields}, body bytes.
"""

import itertools
import json
import socket
import struct
import sys
import time

BROKER = "127.0.0.1:10911"
NAMESRV = "127.0.0.1:9876"

UPDATE_AND_CREATE_TOPIC = 17
GET_ROUTEINFO_BY_TOPIC = 105
UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
SUCCESS = 0
TOPIC_NOT_EXIST = 17

_opaque = itertools.count(1)


class AdminError(RuntimeError):
    pass


def _recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise AdminError("connection closed by peer")
        buf += chunk
    return bytes(buf)


def call(addr, code, ext_fields=None, body=b"", timeout=5.0):
    """one request/response; returns (response code, remark, body bytes)"""
    host, port = addr.rsplit(":", 1)
    opaque = next(_opaque)
    header = json.dumps({
        "code": code,
        "extFields": {k: str(v) for k, v in (ext_fields or {}).items()},
        "flag": 0,
        "language": "PYTHON",
        "opaque": opaque,
        "serializeTypeCurrentRPC": "JSON",
        "version": 0,
    }).encode()
    frame = struct.pack(">ii", 4 + len(header) + len(body), len(header)) + header + body
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(frame)
        total = struct.unpack(">i", _recv_exact(s, 4))[0]
        data = _recv_exact(s, total)
    hlen = struct.unpack(">i", data[:4])[0] & 0xFFFFFF
    resp = json.loads(data[4:4 + hlen])
    return resp.get("code"), resp.get("remark"), data[4 + hlen:]


def topic_exists(topic, namesrv=NAMESRV):
    code, _, _ = call(namesrv, GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    return code == SUCCESS


def create_topic(topic, fifo=False, queues=4, broker=BROKER, namesrv=NAMESRV, wait_route=10.0, priority=False):
    """create or update a topic on the broker; waits until the name server serves its route.
    priority: a PRIORITY topic (RocketMQ 5.5): its queues are the priority levels"""
    if fifo and priority:
        raise ValueError("a topic is FIFO or PRIORITY, not both")
    kind = "FIFO" if fifo else "PRIORITY" if priority else "NORMAL"
    code, remark, _ = call(broker, UPDATE_AND_CREATE_TOPIC, {
        "topic": topic,
        "defaultTopic": "TBW102",
        "readQueueNums": queues,
        "writeQueueNums": queues,
        "perm": 6,
        "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": 0,
        "order": "false",
        "attributes": "+message.type=" + kind,
    })
    if code != SUCCESS:
        raise AdminError(f"create topic {topic}: code {code}: {remark}")
    end = time.monotonic() + wait_route
    while wait_route and not topic_exists(topic, namesrv):
        if time.monotonic() > end:
            raise AdminError(f"topic {topic} created but no route after {wait_route}s")
        time.sleep(0.05)


def create_group(group, fifo=False, broker=BROKER, retry_max_times=16):
    """create or update a consumer group (SubscriptionGroupConfig) on the broker"""
    body = json.dumps({
        "groupName": group,
        "consumeEnable": True,
        "consumeFromMinEnable": True,
        "consumeBroadcastEnable": True,
        "consumeMessageOrderly": bool(fifo),
        "retryQueueNums": 1,
        "retryMaxTimes": retry_max_times,
        "brokerId": 0,
        "whichBrokerWhenConsumeSlowly": 1,
        "notifyConsumerIdsChangedEnable": True,
    }).encode()
    code, remark, _ = call(broker, UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body)
    if code != SUCCESS:
        raise AdminError(f"create group {group}: code {code}: {remark}")


def main(argv):
    if len(argv) < 2 or argv[0] not in ("topic", "group"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    kind, args = argv[0], argv[1:]
    fifo = "fifo" in args or "--fifo" in args
    priority = "priority" in args or "--priority" in args
    if priority and (fifo or any(a.endswith(":fifo") for a in args)):
        print("rmq_admin: a topic is fifo or priority, not both", file=sys.stderr)
        return 2
    if priority and kind == "group":
        print("rmq_admin: priority is a kind of topic; a group reads any topic", file=sys.stderr)
        return 2
    queues = 4
    names = []
    it = iter(args)
    for a in it:
        if a in ("fifo", "--fifo", "priority", "--priority"):
            continue
        if a == "--queues":
            v = next(it, None)
            if v is None or not v.isdigit():
                print("rmq_admin: --queues needs a number", file=sys.stderr)
                return 2
            queues = int(v)
            continue
        names.append(a)
    for n in names:
        one_fifo = fifo or n.endswith(":fifo")
        n = n[:-5] if n.endswith(":fifo") else n
        t0 = time.monotonic()
        if kind == "topic":
            one_priority = priority and not one_fifo
            create_topic(n, fifo=one_fifo, queues=queues, priority=one_priority)
            print(f"topic {n} ({'FIFO' if one_fifo else 'PRIORITY' if one_priority else 'NORMAL'}, {queues} queues) "
                  f"in {1000 * (time.monotonic() - t0):.0f} ms")
        else:
            create_group(n, fifo=one_fifo)
            print(f"group {n} (consumeMessageOrderly={one_fifo}) in {1000 * (time.monotonic() - t0):.0f} ms")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (OSError, AdminError) as e:
        print(f"rmq_admin: {e}", file=sys.stderr)
        sys.exit(1)
