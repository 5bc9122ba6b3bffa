"""send_job takes a junk or raising key= in silence when cost= is a function.

Promise (TracedProducer.send_job Raises; docs/dispatch.md): "a junk ``key=`` answer, or a raising
``cost``/``key``, naming the message; nothing is sent then" — "a ``key=`` that raises or answers
anything but a str or None, is one CostTableError". With ``cost=`` a function (not a table)
``key=`` is never called before the sends, so ``key=lambda m: 42`` or a ``key=`` that raises is
accepted and the whole job sent (priority_levels or not). Severity: low (the key is then unused,
but the documented early error does not come, and a caller's bug goes unseen).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _job import job, rig  # noqa: E402


def raising(m: object) -> str:
    raise RuntimeError("key= fails")


sent = []
for name, key in (("returns 42", lambda m: 42), ("returns bytes", lambda m: b"k"), ("raises", raising)):
    broker, producer = rig()
    try:
        producer.send_job(job(3), cost=lambda m: 1.0, key=key, priority_levels=8)
        sent.append(f"key= {name}: the job was sent ({broker.backlog('g', 'jobs')} messages)")
    except ValueError:
        assert broker.backlog("g", "jobs") == 0
assert not sent, "\n  ".join(["junk key= accepted with a cost function:", *sent])
print("held")
