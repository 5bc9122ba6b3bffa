"""A send_job(priority_levels=) that fails leaves every message a PRIORITY message for good.

Promise (docs/dispatch.md): a job sent with ``priority_levels`` to a topic that is not a PRIORITY
topic fails at its first send ("nothing else sent"); the JobSendError's ``.unsent`` are "never
tried — resend exactly the rest"; the README: "On a normal topic leave out ``priority_levels``".
What happens: ``prioritize`` gives every message its priority before the first send, so after the
JobSendError the failed message and all ``.unsent`` ones (never tried) carry one. Resending them
without ``priority_levels`` to the normal topic fails the same way ("message_type:PRIORITY"), and
the priority cannot be taken off: the embedded and the real 5.x ``Message.priority`` setters both
refuse None (the 5.x client: TypeError). The messages must be rebuilt. The same on the real 5.5
proxy with the 5.x client's messages (2026-12-05 22:40: priorities [7, 5, 2] left, the resend
refused "message_type:PRIORITY, queue access type:NORMAL"). Severity: medium (the
documented failure's obvious recovery fails; "never tried" messages were changed).
"""
from __future__ import annotations

import sys
from pathlib import Path

from tracer.clients.producer import JobSendError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _job import PLAIN_TOPIC, job, rig  # noqa: E402

broker, producer = rig()
messages = job(3, PLAIN_TOPIC)  # meant for the normal topic; priority_levels given by mistake
try:
    producer.send_job(messages, cost=lambda m: 1.0, priority_levels=8)
    raise SystemExit("expected the documented JobSendError: a priority message to a normal topic")
except JobSendError as exc:
    err = exc
assert not err.sent
problems = [f".unsent (never tried) message {m.keys[0]} was given priority {m.priority}"
            for m in err.unsent if m.priority is not None]
try:
    producer.send_job([err.failed, *err.unsent], cost=lambda m: 1.0)  # the rest, without priority_levels
except JobSendError as exc:
    problems.append(f"resent without priority_levels to the normal topic: {exc}")
assert not problems, "\n  ".join(["a failed priority job poisons its messages:", *problems])
print("held")
