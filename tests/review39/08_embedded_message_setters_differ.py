"""The embedded Message's priority/message_group setters are not the 5.x client's, as claimed.

Promise (tracer/embedded.py: "the 5.x client's setter: a FIFO message has no priority", "as strict
as the proxy", each rule "checked against the real proxy"). The installed rocketmq-python-client
(5.1.2) checks ``if self.__priority:`` in the message_group setter, so ``priority = 0`` then
``message_group = "g"`` is ACCEPTED there (the send then goes as FIFO: the client picks FIFO
before PRIORITY), while the embedded Message raises. The reverse too: the client's priority setter
takes ``True`` and ``1.5`` (it only checks ``< 0``; the send fails later, in protobuf), the
embedded one raises at once. Code tested on the embedded broker can therefore behave differently
on the real client: the real 5.5 proxy STORES a FIFO message with priority 0 and a group (sent to a
FIFO topic, checked 2026-12-05 22:40). Needs no proxy (client objects only). Severity: low.
"""
from __future__ import annotations

from typing import Any, Callable

from tracer.clients.quiet import import_quietly
from tracer.embedded import Message as EmbeddedMessage

rocketmq = import_quietly()


def outcome(make: Callable[[], Any], steps: list[tuple[str, object]]) -> str:
    m = make()
    try:
        for name, value in steps:
            setattr(m, name, value)
    except Exception as exc:  # noqa: BLE001
        return f"refused ({type(exc).__name__})"
    return "accepted"


cases = {
    "priority=0 then message_group='g'": [("priority", 0), ("message_group", "g")],
    "priority=True": [("priority", True)],
    "priority=1.5": [("priority", 1.5)],
    "priority=3 then message_group='g'": [("priority", 3), ("message_group", "g")],
    "message_group='g' then priority=0": [("message_group", "g"), ("priority", 0)],
}
differ = []
for name, steps in cases.items():
    real, emb = outcome(rocketmq.Message, steps), outcome(EmbeddedMessage, steps)
    if real.split()[0] != emb.split()[0]:  # the exception types differ by design
        differ.append(f"{name}: 5.x client {real}, embedded {emb}")
assert not differ, "\n  ".join(["the embedded Message's setters differ from the 5.x client's:", *differ])
print("held")
