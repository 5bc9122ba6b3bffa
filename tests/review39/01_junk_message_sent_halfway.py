"""send_job sends half a job before it finds a message of the wrong kind.

Promise (brief; docs/dispatch.md "Longest first at the producer"): every message is checked before
any is sent or changed; a message of the wrong kind is a loud early error naming it by its index.
With ``priority_levels=`` a None/str/dict in the job is refused up front (prioritize's refusal),
but without it nothing looks at the messages before the loop: ``cost=`` happily prices a None, the
first messages are marked (``rmqtrace_order``) and SENT, and only the junk one's send fails, as a
JobSendError ("2 sent before it"). The broker now holds two messages of a job that was junk.
Same for ``TracedLegacyProducer.send_job`` (same ``send_ordered`` loop). Severity: medium.
"""
from __future__ import annotations

import sys
from pathlib import Path

from tracer import MessageTracer
from tracer.clients.legacy import TracedLegacyProducer
from tracer.clients.producer import JobSendError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _job import PLAIN_TOPIC, job, rig  # noqa: E402

failures = []
for junk in (None, "not a message", {"topic": PLAIN_TOPIC}, 42):
    broker, producer = rig()
    messages: list[object] = list(job(4, PLAIN_TOPIC))
    messages.insert(2, junk)
    try:
        producer.send_job(messages, cost=lambda m: 1.0, order="arrival")
        failures.append(f"{junk!r}: accepted")
    except JobSendError as exc:
        failures.append(f"{junk!r}: {len(exc.sent)} sent, broker holds {broker.backlog('g', PLAIN_TOPIC)}: {exc}")
    except (TypeError, ValueError) as exc:  # the early refusal asked for: nothing sent
        assert broker.backlog("g", PLAIN_TOPIC) == 0, exc
        assert "message 2" in str(exc), f"the refusal must name message 2: {exc}"


class LegacyMessage:  # what TracedLegacyProducer reads of a 2.x message
    def __init__(self, key: str) -> None:
        self.topic, self.tags, self.keys, self.props = PLAIN_TOPIC, None, key, {}

    def set_property(self, k: str, v: str) -> None:
        self.props[k] = v


class LegacyReceipt:
    def __init__(self, n: int) -> None:
        self.msg_id = f"id{n}"


class LegacyProducer:  # a 2.x producer's send_sync
    def __init__(self) -> None:
        self.sent: list[object] = []

    def send_sync(self, m: object) -> LegacyReceipt:
        self.sent.append(m)
        return LegacyReceipt(len(self.sent))


legacy = LegacyProducer()
legacy_job: list[object] = [LegacyMessage(f"k{i}") for i in range(4)]
legacy_job.insert(2, None)
try:
    TracedLegacyProducer(legacy, MessageTracer()).send_job(legacy_job, cost=lambda m: 1.0, order="arrival")
except JobSendError as exc:
    failures.append(f"2.x None: {len(legacy.sent)} sent: {exc}")
except (TypeError, ValueError) as exc:
    assert not legacy.sent, exc
assert not failures, "junk message not refused before the first send:\n  " + "\n  ".join(failures)
print("held")
