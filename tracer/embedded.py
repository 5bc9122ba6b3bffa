"""An in-process broker with the surface of ``rocketmq-python-client`` 5.x, as strict as the proxy.

``Producer`` and ``SimpleConsumer`` here take the same calls as ``rocketmq.Producer`` and
``rocketmq.SimpleConsumer`` (``startup``, ``send``, ``send_async``, ``receive(max_message_num,
invisible_duration)``, ``ack``, ``change_invisible_duration``, ``shutdown``) and received messages
carry the same fields (``message_id``, ``delivery_attempt``, ``receipt_handle``, store and decode
timestamps in ms). It is the demo's broker and the fast tests' broker. Users may use it in their
own tests: :class:`EmbeddedBroker`'s public methods (``store``, ``subscribe``, ``receive``,
``ack``, ``change_invisible``) are what the two clients call.

Semantics kept from RocketMQ 5 (pop consumption): a received message is invisible to the group
for ``invisible_duration`` seconds; acked it is gone; not acked it comes back with
``delivery_attempt + 1``. ``change_invisible_duration`` gives the message a new receipt handle
(the old one keeps working until its own time ends).

A FIFO topic is read the way the broker's orderly pop reads it (``PopMessageProcessor`` with
``order=true``, ``ConsumerOrderInfoManager``): its message groups are spread over queues, and a
receive takes from each queue that is not blocked a consecutive run in send order (so several
messages of one group may come in one receive); a queue stays blocked while any message of its
last run is neither acked nor past its invisible time (a renewal or ``change_invisible_duration``
moves that time). Once unblocked, the queue is read again from its first unacked message: the run
after a nack or an expiry starts there and carries the later messages again, acked or not. Every
message of a run carries the same ``delivery_attempt``: one more than the fewest runs in a row
any of its messages came in before, so 1 as soon as the run holds a message not handed out before
(the local-mode proxy reads the queue's count, not the message's). ``ack`` and ``change_invisible_duration`` of a
message of an earlier run, or of an acked one, are accepted and change nothing.

The rules the tracer relies on are the proxy's (``tests/test_broker_rules_real.py`` runs each
against the real 5.5 proxy and this broker and expects the same answer):

* durations are whole seconds (``int``; the 5.x client raises ``TypeError`` on a float);
* ``receive``'s invisible time must lie in [``min_receive_invisible``, ``max_invisible``]
  (the proxy's ``minInvisibleTimeMillsForRecv``, default 10 s, and ``maxInvisibleTimeMills``,
  default 12 h), ``change_invisible_duration``'s in [0, ``max_invisible``]; otherwise
  code 40011 ``"the invisibleTime is too small. min is <ms>"`` / ``"... too large. max is <ms>"``;
* a receipt handle whose own invisible time has passed is refused for ``ack`` and
  ``change_invisible_duration`` with code 40013 ``"receipt handle is expired"`` (the proxy
  decides from the handle alone, even if nobody received the message again yet);
* nothing else: a handle replaced by ``change_invisible_duration`` keeps working until its own
  time ends, a second ack is accepted, and so is a renewal after the ack — which brings the
  acked message back (``delivery_attempt + 1``) on a normal topic and changes nothing on a FIFO
  one, as on the proxy (5.5, local mode);
* a FIFO topic's queues as above (a consecutive run per queue, the queue blocked while one of the
  run is in flight, the run after a nack or an expiry from the first unacked message on);
* a message's type is its topic's, checked before the send as the 5.x client does ("current
  message type not match with queue accept message types"): one with a priority only to a
  PRIORITY topic, one with a message group only to a FIFO topic, any other only to a normal one;
  a message takes a priority or a message group, not both;
* a PRIORITY topic (RocketMQ 5.5) stores a message of priority p in queue ``min(p, queues - 1)``;
  a receive takes from the highest queue that holds one, each queue in send order, and a
  received message says its priority as sent.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable, Hashable, Iterable, Mapping, NamedTuple

__all__ = [
    "ILLEGAL_INVISIBLE_TIME",
    "INVALID_RECEIPT_HANDLE",
    "PROXY_MAX_INVISIBLE_S",
    "PROXY_MIN_RECEIVE_INVISIBLE_S",
    "EmbeddedBroker",
    "EmbeddedBrokerError",
    "FilterExpression",
    "Message",
    "Producer",
    "SendReceipt",
    "SimpleConsumer",
]

ILLEGAL_INVISIBLE_TIME = 40011  # apache.rocketmq.v2.Code, as the proxy answers
INVALID_RECEIPT_HANDLE = 40013
PROXY_MIN_RECEIVE_INVISIBLE_S = 10.0  # ProxyConfig.minInvisibleTimeMillsForRecv default
PROXY_MAX_INVISIBLE_S = 12 * 3600.0  # ProxyConfig.maxInvisibleTimeMills default


class EmbeddedBrokerError(Exception):
    """What the real client raises as ``rocketmq.v5.exception`` errors; ``code`` is the proxy's
    status code when the proxy would answer with one (0 for client-side checks)."""

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(f"{code}, {message}" if code else message)  # the 5.x client's format
        self.code = code


class FilterExpression:
    def __init__(self, expression: str = "*") -> None:
        self.expression = expression

    def accepts(self, tag: str | None) -> bool:
        e = self.expression.strip()
        return e in ("", "*") or (tag is not None and tag in {t.strip() for t in e.split("||")})


class Message:
    """Same attribute names as ``rocketmq.Message``."""

    def __init__(self) -> None:
        self.topic: str = ""
        self.body: bytes = b""
        self.tag: str | None = None
        self._keys: list[str] = []
        self._message_group: str | None = None
        self._priority: int | None = None
        self._properties: dict[str, str] = {}
        self.message_id: str | None = None
        self.delivery_attempt: int | None = None
        self.receipt_handle: str | None = None
        self.born_timestamp: int | None = None
        self.store_timestamp: int | None = None  # ms, broker clock
        self.decode_message_timestamp: int | None = None  # ms, consumer clock

    @property
    def keys(self) -> list[str]:
        return self._keys

    @keys.setter
    def keys(self, *keys: str) -> None:
        # rocketmq.Message takes `msg.keys = "k"` (the setter has a *keys signature)
        for k in keys:
            self._keys.extend(k if isinstance(k, (list, tuple, set)) else [k])

    @property
    def message_group(self) -> str | None:
        return self._message_group

    @message_group.setter
    def message_group(self, group: str | None) -> None:
        if group and self._priority:  # the 5.x client's setter: a priority refuses a group (0 does not)
            raise EmbeddedBrokerError("message_group and priority should not be set at same time.")
        self._message_group = group

    @property
    def priority(self) -> int | None:
        """A PRIORITY topic's level (>= 0; the broker reads any above its queues as the top)."""
        return self._priority

    @priority.setter
    def priority(self, priority: int) -> None:
        # the 5.x client's setter, as it is: only a negative is refused (it compares, nothing more),
        # and a message with a group takes none
        if priority < 0:
            raise EmbeddedBrokerError("priority must be greater than or equal to 0.")
        if self.message_group:
            raise EmbeddedBrokerError("priority and message_group should not be set at same time.")
        self._priority = priority

    @property
    def properties(self) -> dict[str, str]:
        return self._properties

    def add_property(self, key: str, value: str) -> None:
        if not isinstance(key, str) or not isinstance(value, str):
            raise EmbeddedBrokerError("property key and value must be str")
        self._properties[key] = value


@dataclass
class SendReceipt:
    message_id: str


@dataclass
class _Stored:
    offset: int
    message_id: str
    topic: str
    body: bytes
    tag: str | None
    keys: tuple[str, ...]
    group: str | None
    properties: dict[str, str]
    born_ms: int
    store_ms: int
    priority: int | None = None


@dataclass
class _InFlight:
    record: _Stored
    attempt: int
    handle: str
    deadline: float
    delivery: int  # one number per receive of the message: its handles name it


@dataclass
class _RunEntry:
    """One message of a FIFO queue's last run (what the broker's ``OrderInfo`` keeps per offset)."""

    record: _Stored
    attempt: int
    handle: str
    deadline: float  # the offset's next visible time
    delivery: int
    repeats: int  # runs in a row it was handed out in, less one (the broker's offsetConsumedCount)
    pop_ms: int  # the run's pop time (wall ms): a renewal's handle keeps it, as the broker's does
    queue_id: int
    acked: bool = False


@dataclass
class _FifoQueue:
    """One queue of a FIFO topic as one group reads it: the records from its commit offset on, the
    first ``len(run)`` of them handed out by the queue's last pop."""

    records: deque[_Stored] = field(default_factory=deque)
    run: deque[_RunEntry] = field(default_factory=deque)

    def blocked(self, now: float) -> bool:
        return any(not e.acked and e.deadline > now for e in self.run)


class _HandleExpiry(NamedTuple):  # a heap entry: the soonest deadline first
    deadline: float
    message_id: str
    handle: str


class _AckedExpiry(NamedTuple):  # a heap entry: the soonest deadline first
    deadline: float
    message_id: str
    delivery: int


class _Handle(NamedTuple):  # what a receipt handle of ours carries besides the proxy's fields
    message_id: str
    delivery: int
    deadline: float  # on the broker's monotonic clock


@dataclass
class _Subscription:
    offset: int = 0
    inflight: dict[str, _InFlight] = field(default_factory=dict)  # message id -> lease
    expiry: list[_HandleExpiry] = field(default_factory=list)  # a heap
    redeliver: deque[tuple[_Stored, int]] = field(default_factory=deque)  # (record, next attempt)
    # FIFO topics: queue -> what is not committed yet; delivery -> its entry in a queue's last run
    queues: dict[Hashable, _FifoQueue] = field(default_factory=dict)
    live: dict[int, tuple[_FifoQueue, _RunEntry]] = field(default_factory=dict)
    turn: int = 0  # the queue a receive starts at moves on by one (the broker starts at a random one)
    # PRIORITY topics: queue (the level, clamped) -> what it holds past the offset, in send order
    levels: dict[int, deque[_Stored]] = field(default_factory=dict)
    # acked leases whose last handle has not expired yet: a renewal with it revives the message
    acked: dict[str, _InFlight] = field(default_factory=dict)
    acked_expiry: list[_AckedExpiry] = field(default_factory=list)  # a heap


class _Topic:
    def __init__(self, name: str, fifo: bool, queues: int | None = None, priority: bool = False) -> None:
        self.name = name
        self.fifo = fifo
        self.priority = priority
        self.queues = queues  # FIFO: None gives each message group its own queue; PRIORITY: the levels
        self.log: list[_Stored] = []
        self.base = 0  # offset of log[0]: records below it were dropped (keep_consumed=False)

    def end(self) -> int:
        return self.base + len(self.log)


def _kind(topic: _Topic) -> str:
    """The topic's ``message.type``, as the 5.x client's errors name it."""
    return "PRIORITY" if topic.priority else "FIFO" if topic.fifo else "NORMAL"


def _whole_seconds(value: object, what: str) -> int:
    # the 5.x client puts durations into a protobuf Duration's int ``seconds``: a float raises
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int number of seconds, got {type(value).__name__}")
    return value


# One counter for every broker in the process: like the proxy's, a message id is unique (the consume
# loop's no-two-copies guard is process-wide, keyed by group and message id).
_MESSAGE_IDS = itertools.count(1)


def _decode_handle(handle: str | None) -> _Handle | None:
    """(message id, delivery, deadline): a handle carries its own invisible-time end, as the
    proxy's does. Its layout is the proxy's (``startOffset retrieveTime invisibleTime
    reviveQueueId topicType brokerName queueId offset commitLogOffset``, space-separated: pop time
    in wall ms, invisible time in ms; :func:`tracer.clients.lease.broker_lease` reads both the
    same way), with two fields of ours after it: the message id and the deadline on the
    broker's monotonic clock."""
    try:
        fields = str(handle).split(" ")
        if len(fields) != 11:
            return None
        return _Handle(fields[9], int(fields[7]), float(fields[10]))
    except ValueError:
        return None


class EmbeddedBroker:
    """Topics, consumer-group subscriptions and leases, guarded by one condition variable.

    ``keep_consumed=False`` drops stored records once every subscribed group has read past them
    (in-flight ones stay with their leases), so a long run's memory is what is in flight, as on
    a real broker whose retention has passed; a group subscribing later starts after them. It
    also forgets an acked message of a normal topic at once, so a renewal after its ack is refused
    (40013) there instead of bringing the message back as on the proxy.
    ``min_receive_invisible`` / ``max_invisible`` (seconds) are the proxy's limits; lower the
    minimum like ``minInvisibleTimeMillsForRecv`` in ``rmq-proxy.json`` for short-lease tests.
    """

    def __init__(self, *, auto_create_topics: bool = True, monotonic: Callable[[], float] = time.monotonic,
                 wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
                 keep_consumed: bool = True,
                 min_receive_invisible: float = PROXY_MIN_RECEIVE_INVISIBLE_S,
                 max_invisible: float = PROXY_MAX_INVISIBLE_S) -> None:
        if not 0 <= min_receive_invisible <= max_invisible:
            raise ValueError("need 0 <= min_receive_invisible <= max_invisible")
        self.auto_create_topics = auto_create_topics
        self.keep_consumed = keep_consumed
        self.min_receive_invisible = min_receive_invisible
        self.max_invisible = max_invisible
        self._monotonic = monotonic
        self._wall_ms = wall_ms
        self._cond = threading.Condition()
        self._topics: dict[str, _Topic] = {}
        self._subs: dict[tuple[str, str], _Subscription] = {}
        self._handles = itertools.count(1)
        self._deliveries = itertools.count(1)

    # -- admin ---------------------------------------------------------------------------
    def create_topic(self, name: str, fifo: bool = False, queues: int | None = None, *,
                     priority: bool = False) -> None:
        """``queues``: for a FIFO topic, how many queues the message groups are spread over, by
        the 5.x client's rule (``sha256(group) % queues``); groups of one queue block each other
        as on the broker; None gives each group a queue of its own (no two groups share one).
        ``priority``: a PRIORITY topic (``message.type=PRIORITY``, RocketMQ 5.5) of ``queues``
        levels (default 8): a message of priority p is stored in queue ``min(p, queues - 1)`` and a
        receive takes the highest queue that holds one first, each queue in send order.

        Raises:
            ValueError: ``queues`` not a positive int, or given for a normal topic; a topic both
                FIFO and PRIORITY; the topic exists already as another kind or with other queues.
        """
        if fifo and priority:
            raise ValueError("a topic is FIFO or PRIORITY, not both (message.type is one of them)")
        if priority and queues is None:
            queues = 8
        if queues is not None:
            if not (fifo or priority):
                raise ValueError("queues= is for a FIFO or PRIORITY topic: a normal topic's queues change no "
                                 "answer here")
            if isinstance(queues, bool) or not isinstance(queues, int) or queues < 1:
                raise ValueError(f"queues must be a positive int, got {queues!r}")
        with self._cond:
            have = self._topics.setdefault(name, _Topic(name, fifo, queues, priority))
            if (have.fifo, have.priority, have.queues) != (fifo, priority, queues):
                # a second create of another kind would change no answer here: say so at once, not
                # at the first send (a producer's or consumer's startup creates a normal topic)
                raise ValueError(f"topic {name!r} exists already as {_kind(have)}; create it before any client "
                                 "starts on it")

    def ensure_topic(self, name: str) -> None:
        """The topic exists afterwards (created as a normal topic when ``auto_create_topics``)."""
        with self._cond:
            self._topic(name)

    def _topic(self, name: str) -> _Topic:
        t = self._topics.get(name)
        if t is None:
            if not self.auto_create_topics:
                raise EmbeddedBrokerError(f"topic {name!r} does not exist")
            t = self._topics[name] = _Topic(name, False)
        return t

    def backlog(self, group: str, topic: str) -> int:
        """Messages not yet acked by ``group`` (stored after its offset, held, or in flight)."""
        with self._cond:
            sub = self._subs.get((group, topic))
            t = self._topics.get(topic)
            if t is None:
                return 0
            if sub is None:
                return len(t.log)
            uncommitted = sum(len(q.records) for q in sub.queues.values()) + sum(map(len, sub.levels.values()))
            return t.end() - sub.offset + uncommitted + len(sub.inflight) + len(sub.redeliver)

    def stored(self, topic: str) -> int:
        """Records the broker still keeps for ``topic`` (what ``keep_consumed=False`` bounds): its
        log, and what a group read off it but has not consumed yet (a FIFO or PRIORITY topic's
        queues hold those per group), each record once."""
        with self._cond:
            t = self._topics.get(topic)
            if t is None:
                return 0
            held = {id(r) for (_, name), sub in self._subs.items() if name == topic
                    for q in (*sub.levels.values(), *(f.records for f in sub.queues.values()))
                    for r in q if r.offset < t.base}
            return len(t.log) + len(held)

    def _subscription(self, group: str, topic: _Topic) -> _Subscription:
        """``group``'s subscription to ``topic``; a new one starts at the oldest record the topic
        still keeps (with ``keep_consumed=False`` the ones below were dropped)."""
        sub = self._subs.get((group, topic.name))
        if sub is None:
            sub = self._subs[(group, topic.name)] = _Subscription(offset=topic.base)
        return sub

    # -- producer side -------------------------------------------------------------------
    def store(self, msg: Message) -> str:
        """Append ``msg`` to its topic; returns the new message id."""
        if not msg.topic:
            raise EmbeddedBrokerError("message has no topic")
        body = msg.body.encode() if isinstance(msg.body, str) else bytes(msg.body or b"")
        with self._cond:
            topic = self._topic(msg.topic)
            if topic.fifo and not msg.message_group:
                raise EmbeddedBrokerError(f"FIFO topic {topic.name!r} needs a message_group")
            priority = getattr(msg, "priority", None)
            if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
                # the 5.x client's setter takes any of them; the protobuf field at the send does not
                raise TypeError(f"Field apache.rocketmq.v2.SystemProperties.priority: Expected an int, got "
                                f"{type(priority).__name__}")
            # the 5.x client's __send_message_type: a group makes it FIFO, even with a priority (0)
            kind = "FIFO" if msg.message_group else "PRIORITY" if priority is not None else "NORMAL"
            accepts = _kind(topic)
            if kind != accepts:  # the 5.x client's check before the send: a message's type is its topic's
                raise EmbeddedBrokerError("current message type not match with queue accept message types, "
                                          f"topic:{topic.name}, message_type:{kind}, queue access type:{accepts}")
            mid = f"EMB{next(_MESSAGE_IDS):020d}"
            topic.log.append(_Stored(topic.end(), mid, topic.name, body, msg.tag, tuple(msg.keys),
                                     msg.message_group, dict(msg.properties),
                                     born_ms=self._wall_ms(), store_ms=self._wall_ms(), priority=priority))
            self._cond.notify_all()
        return mid

    # -- consumer side -------------------------------------------------------------------
    def subscribe(self, group: str, topic: str) -> None:
        with self._cond:
            self._subscription(group, self._topic(topic))

    def _check_invisible(self, seconds: int, minimum: float) -> None:
        if seconds < minimum:
            raise EmbeddedBrokerError(f"the invisibleTime is too small. min is {int(minimum * 1000)}",
                                      ILLEGAL_INVISIBLE_TIME)
        if seconds > self.max_invisible:
            raise EmbeddedBrokerError(f"the invisibleTime is too large. max is {int(self.max_invisible * 1000)}",
                                      ILLEGAL_INVISIBLE_TIME)

    def receive(self, group: str, filters: Mapping[str, FilterExpression], max_num: int,
                invisible_duration: int, await_s: float) -> list[Message]:
        """Up to ``max_num`` messages for ``group``, each invisible to the group for
        ``invisible_duration`` whole seconds; waits up to ``await_s`` when there are none.

        The wait (long polling) is real time, whatever ``monotonic`` the broker was given: with
        a manual clock, leases move only when the test moves the clock."""
        if max_num <= 0:
            raise EmbeddedBrokerError("max_message_num must be positive")
        invisible = _whole_seconds(invisible_duration, "invisible_duration")
        self._check_invisible(invisible, max(self.min_receive_invisible, 1e-9))
        poll_end = time.monotonic() + await_s
        with self._cond:
            for topic in filters:
                self._subscription(group, self._topic(topic))
            while True:
                now = self._monotonic()
                out: list[Message] = []
                for topic, flt in filters.items():
                    if len(out) >= max_num:
                        break
                    out.extend(self._take(group, self._topics[topic], flt, max_num - len(out), invisible, now))
                left = poll_end - time.monotonic()
                if out or left <= 0:
                    return out
                self._cond.wait(timeout=min(left, self._next_expiry(group, filters, now)))

    def _next_expiry(self, group: str, filters: Iterable[str], now: float) -> float:
        soonest = 3600.0
        for topic in filters:
            sub = self._subs[(group, topic)]
            if sub.expiry:
                soonest = min(soonest, max(0.0, sub.expiry[0].deadline - now))
            for q in sub.queues.values():
                for e in q.run:
                    if not e.acked and e.deadline > now:
                        soonest = min(soonest, e.deadline - now)
        return soonest

    def _take(self, group: str, topic: _Topic, flt: FilterExpression, n: int, invisible: float,
              now: float) -> list[Message]:
        sub = self._subs[(group, topic.name)]
        if topic.fifo:
            got = self._take_fifo(sub, topic, flt, n, invisible, now)
            if not self.keep_consumed:
                self._drop_consumed(topic)
            return got
        while sub.acked_expiry and sub.acked_expiry[0].deadline <= now:
            _, mid, delivery = heapq.heappop(sub.acked_expiry)
            gone = sub.acked.get(mid)
            if gone is not None and gone.delivery == delivery:
                del sub.acked[mid]
        # leases that ran out come back first, with their attempt count raised
        while sub.expiry and sub.expiry[0].deadline <= now:
            _, mid, handle = heapq.heappop(sub.expiry)
            lease = sub.inflight.get(mid)
            if lease is not None and lease.handle == handle:
                del sub.inflight[mid]
                sub.redeliver.append((lease.record, lease.attempt + 1))
        out: list[Message] = []
        if topic.priority:
            # PopMessageProcessor on a PRIORITY topic: from the highest queue down, each in send
            # order; the retry topic only to fill what is left (popFromRetryProbabilityForPriority 0)
            self._take_levels(sub, topic, flt, n, invisible, now, out)
        while sub.redeliver and len(out) < n:
            rec, attempt = sub.redeliver.popleft()
            out.append(self._lease(sub, rec, attempt, invisible, now))
        while len(out) < n and sub.offset < topic.end():
            rec = topic.log[sub.offset - topic.base]
            sub.offset += 1
            if not flt.accepts(rec.tag):
                continue  # filtered out for this group: consumed without delivery, as on a broker
            out.append(self._lease(sub, rec, 1, invisible, now))
        if not self.keep_consumed:
            self._drop_consumed(topic)
        return out

    def _take_levels(self, sub: _Subscription, topic: _Topic, flt: FilterExpression, n: int, invisible: float,
                     now: float, out: list[Message]) -> None:
        top = (topic.queues or 1) - 1
        while sub.offset < topic.end():
            rec = topic.log[sub.offset - topic.base]
            sub.offset += 1
            if flt.accepts(rec.tag):  # one filtered out is consumed without delivery, as on a broker
                sub.levels.setdefault(min(rec.priority or 0, top), deque()).append(rec)
        for level in sorted(sub.levels, reverse=True):
            q = sub.levels[level]
            while q and len(out) < n:
                out.append(self._lease(sub, q.popleft(), 1, invisible, now, queue_id=level))
            if not q:
                del sub.levels[level]  # memory is what is pending
            if len(out) >= n:
                return

    def _queue_key(self, topic: _Topic, group: str | None) -> Hashable:
        if topic.queues is None:
            return group
        # the 5.x client's MessageQueueSelector.select_queue_by_hash_key
        return int.from_bytes(hashlib.sha256(str(group).encode()).digest(), "big") % topic.queues

    def _take_fifo(self, sub: _Subscription, topic: _Topic, flt: FilterExpression, n: int, invisible: float,
                   now: float) -> list[Message]:
        """The orderly pop: from each queue not blocked, its consecutive run from the commit offset."""
        while sub.offset < topic.end():
            rec = topic.log[sub.offset - topic.base]
            sub.offset += 1
            if flt.accepts(rec.tag):  # one filtered out is consumed without delivery, as on a broker
                sub.queues.setdefault(self._queue_key(topic, rec.group), _FifoQueue()).records.append(rec)
        keys = list(sub.queues)
        if not keys:
            return []
        start = sub.turn % len(keys)
        sub.turn += 1
        out: list[Message] = []
        for key in keys[start:] + keys[:start]:
            q = sub.queues[key]
            if len(out) >= n:
                break
            if not q.records:
                del sub.queues[key]  # nothing uncommitted: forgotten, so memory is what is pending
                continue
            if not q.blocked(now):
                out.extend(self._pop_run(sub, q, key, n - len(out), invisible, now))
        return out

    def _pop_run(self, sub: _Subscription, q: _FifoQueue, key: Hashable, n: int, invisible: float,
                 now: float) -> list[Message]:
        earlier = {e.record.message_id: e.repeats for e in q.run}
        for e in q.run:
            del sub.live[e.delivery]  # their handles now belong to an earlier pop: acks change nothing
        q.run.clear()
        records = list(itertools.islice(q.records, n))
        repeats = [earlier[r.message_id] + 1 if r.message_id in earlier else 0 for r in records]
        # ConsumerOrderInfoManager.update: the run's count is the least of its messages', 0 when one is new
        attempt = 1 + (min(repeats) if all(r.message_id in earlier for r in records) else 0)
        queue_id = key if isinstance(key, int) else 0
        pop_ms = self._wall_ms()
        out: list[Message] = []
        for rec, rep in zip(records, repeats):
            delivery = next(self._deliveries)
            deadline = now + invisible
            handle = self._new_handle(rec.message_id, delivery, deadline, invisible, queue_id, pop_ms)
            entry = _RunEntry(rec, attempt, handle, deadline, delivery, rep, pop_ms, queue_id)
            q.run.append(entry)
            sub.live[delivery] = (q, entry)
            out.append(self._message(rec, attempt, handle))
        return out

    def _drop_consumed(self, topic: _Topic) -> None:
        low = min(s.offset for (_, t), s in self._subs.items() if t == topic.name)
        if low - topic.base >= 1024:  # in chunks: deleting a list's head is O(len)
            del topic.log[:low - topic.base]
            topic.base = low

    def _new_handle(self, message_id: str, delivery: int, deadline: float, invisible: float,
                    queue_id: int = 0, pop_ms: int | None = None) -> str:
        """``pop_ms`` and ``invisible`` are the handle's pop time and length (``broker_lease``
        reads them): by default now and the lease's length."""
        seq = next(self._handles)
        pop = self._wall_ms() if pop_ms is None else pop_ms
        return (f"{seq} {pop} {int(invisible * 1000)} 0 0 embedded {queue_id} {delivery} {seq} "
                f"{message_id} {deadline!r}")

    def _lease(self, sub: _Subscription, rec: _Stored, attempt: int, invisible: float, now: float,
               queue_id: int = 0) -> Message:
        deadline = now + invisible
        delivery = next(self._deliveries)
        handle = self._new_handle(rec.message_id, delivery, deadline, invisible, queue_id)
        sub.inflight[rec.message_id] = _InFlight(rec, attempt, handle, deadline, delivery)
        heapq.heappush(sub.expiry, _HandleExpiry(deadline, rec.message_id, handle))
        return self._message(rec, attempt, handle)

    def _message(self, rec: _Stored, attempt: int, handle: str) -> Message:
        m = Message()
        m.topic, m.body, m.tag, m._message_group = rec.topic, rec.body, rec.tag, rec.group
        m._keys = list(rec.keys)
        m._properties = dict(rec.properties)
        m._priority = rec.priority
        m.message_id, m.delivery_attempt, m.receipt_handle = rec.message_id, attempt, handle
        m.born_timestamp, m.store_timestamp = rec.born_ms, rec.store_ms
        m.decode_message_timestamp = self._wall_ms()
        return m

    def _checked(self, group: str, topic: str, message_id: str | None,
                 receipt_handle: str | None) -> tuple[_Subscription, int]:
        """The subscription and delivery ``receipt_handle`` names, refused when it has expired.

        Like the proxy, only the handle's own expiry makes it invalid: a handle replaced by
        ``change_invisible_duration`` but not yet expired still works, and acking twice is
        accepted (both checked against the real proxy).
        """
        decoded = _decode_handle(receipt_handle)
        if decoded is None or decoded.message_id != message_id:
            raise EmbeddedBrokerError("receipt handle cannot be decoded", INVALID_RECEIPT_HANDLE)
        if decoded.deadline <= self._monotonic():
            raise EmbeddedBrokerError("receipt handle is expired", INVALID_RECEIPT_HANDLE)
        sub = self._subs.get((group, topic))
        if sub is None:
            raise EmbeddedBrokerError(f"group {group!r} does not subscribe to {topic!r}")
        return sub, decoded.delivery

    def _lease_of(self, sub: _Subscription, message_id: str | None, delivery: int) -> _InFlight | None:
        """The lease of ``delivery`` (in flight, or acked with a live handle), None when gone."""
        lease = sub.inflight.get(message_id or "")
        if lease is None or lease.delivery != delivery:
            gone = sub.acked.get(message_id or "")
            return gone if gone is not None and gone.delivery == delivery else None
        return lease

    def ack(self, group: str, topic: str, message_id: str | None, receipt_handle: str | None) -> None:
        """The message is consumed by ``group``; refused for an expired handle."""
        with self._cond:
            sub, delivery = self._checked(group, topic, message_id, receipt_handle)
            if self._topics[topic].fifo:
                self._ack_fifo(sub, delivery)
                return
            lease = self._lease_of(sub, message_id, delivery)
            if lease is None or sub.inflight.get(lease.record.message_id) is not lease:
                return  # acked already: the proxy answers OK
            del sub.inflight[lease.record.message_id]
            if self.keep_consumed:
                sub.acked[lease.record.message_id] = lease
                heapq.heappush(sub.acked_expiry, _AckedExpiry(lease.deadline, lease.record.message_id, lease.delivery))
            self._cond.notify_all()

    def _ack_fifo(self, sub: _Subscription, delivery: int) -> None:
        found = sub.live.get(delivery)
        if found is None:
            return  # an earlier run's, or committed already: the broker answers OK and changes nothing
        q, entry = found
        entry.acked = True
        while q.run and q.run[0].acked:  # the commit offset moves to the first unacked message
            del sub.live[q.run.popleft().delivery]
            q.records.popleft()
        self._cond.notify_all()

    def change_invisible(self, group: str, topic: str, message_id: str | None, receipt_handle: str | None,
                         invisible_duration: int) -> str:
        """Make the message invisible for ``invisible_duration`` s from now; returns the new
        receipt handle. Refused for an expired handle."""
        invisible = _whole_seconds(invisible_duration, "invisible_duration")
        self._check_invisible(invisible, 0)
        with self._cond:
            sub, delivery = self._checked(group, topic, message_id, receipt_handle)
            deadline = self._monotonic() + invisible
            if self._topics[topic].fifo:
                found = sub.live.get(delivery)
                if found is None or found[1].acked:
                    # an earlier run's, committed or acked: accepted, and nothing comes back
                    return self._new_handle(str(message_id), delivery, deadline, invisible)
                entry = found[1]
                # the broker's orderly renewal keeps the pop time; its length runs to the new end
                length = (self._wall_ms() + invisible * 1000 - entry.pop_ms) / 1000
                entry.deadline = deadline
                entry.handle = self._new_handle(str(message_id), delivery, deadline, length, entry.queue_id,
                                                entry.pop_ms)
                self._cond.notify_all()
                return entry.handle
            lease = self._lease_of(sub, message_id, delivery)
            if lease is None:
                raise EmbeddedBrokerError(f"message {message_id} is not in flight", INVALID_RECEIPT_HANDLE)
            if sub.inflight.get(lease.record.message_id) is not lease:
                # renewing an acked message puts it back in flight, as on the proxy
                del sub.acked[lease.record.message_id]
                sub.inflight[lease.record.message_id] = lease
            lease.deadline = deadline
            lease.handle = self._new_handle(lease.record.message_id, lease.delivery, lease.deadline, invisible)
            heapq.heappush(sub.expiry, _HandleExpiry(lease.deadline, lease.record.message_id, lease.handle))
            self._cond.notify_all()
            return lease.handle


class Producer:
    def __init__(self, broker: EmbeddedBroker, topics: Iterable[str] = ()) -> None:
        self._broker = broker
        self._topics = tuple(topics)
        self._running = False

    def startup(self) -> None:
        for t in self._topics:
            self._broker.ensure_topic(t)
        self._running = True

    def shutdown(self) -> None:
        self._running = False

    def send(self, message: Message) -> SendReceipt:
        if not self._running:
            raise EmbeddedBrokerError("producer is not started")
        return SendReceipt(self._broker.store(message))

    def send_async(self, message: Message) -> Future[SendReceipt]:
        fut: Future[SendReceipt] = Future()
        try:
            fut.set_result(self.send(message))
        except Exception as exc:  # noqa: BLE001 - delivered through the future, like the client
            fut.set_exception(exc)
        return fut


class SimpleConsumer:
    def __init__(self, broker: EmbeddedBroker, consumer_group: str,
                 subscription: Mapping[str, FilterExpression | None] | None = None,
                 await_duration: float = 1.0) -> None:
        self._broker = broker
        self.consumer_group = consumer_group
        self._filters = {t: f or FilterExpression() for t, f in (subscription or {}).items()}
        self.await_duration = await_duration
        self._running = False

    @property
    def min_receive_invisible(self) -> float:
        """The broker's minimum for ``receive``'s invisible time (the consume loop checks it)."""
        return self._broker.min_receive_invisible

    def startup(self) -> None:
        for topic in self._filters:
            self._broker.subscribe(self.consumer_group, topic)
        self._running = True

    def shutdown(self) -> None:
        self._running = False

    def subscribe(self, topic: str, filter_expression: FilterExpression | None = None) -> None:
        self._filters[topic] = filter_expression or FilterExpression()
        if self._running:
            self._broker.subscribe(self.consumer_group, topic)

    def receive(self, max_message_num: int, invisible_duration: int) -> list[Message]:
        if not self._running:
            raise EmbeddedBrokerError("consumer is not started")
        return self._broker.receive(self.consumer_group, self._filters, max_message_num,
                                    invisible_duration, self.await_duration)

    def ack(self, message: Message) -> None:
        self._broker.ack(self.consumer_group, message.topic, message.message_id, message.receipt_handle)

    def change_invisible_duration(self, message: Message, invisible_duration: int) -> None:
        # the handle changes only once the broker said yes (unlike the 5.1.2 client, which
        # overwrites it with the empty handle of a failed answer)
        message.receipt_handle = self._broker.change_invisible(
            self.consumer_group, message.topic, message.message_id, message.receipt_handle, invisible_duration)
