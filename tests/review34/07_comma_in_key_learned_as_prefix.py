"""Promise (report/costs.py, docs/dispatch.md): the table is keyed by the message's first key — what
message_key() reads on the producer — so `report --costs` writes a table the producer reads back.

Steps: a run with messages keyed "suite,a" (4 s), "b" and "c" (50 ms): `report --costs`; then the
producer's message_key() of a message keyed "suite,a" looked up in the loaded table.

Expected: the table holds "suite,a": 4.0, and that message is sent first.
Actual: the record joins a message's keys with "," and the learner splits on ",": the table holds
"suite": 4.0; the producer's "suite,a" is unknown and takes the median (50 ms).
"""
import tempfile

from _spans import report, span, write

from tracer.dispatch.cost import message_key
from tracer.dispatch.costtable import load_costs
from tracer.embedded import Message

d = tempfile.mkdtemp()
write(f"{d}/s.jsonl", [span(0, ["suite,a"], 4.0), span(1, ["b"], 0.05), span(2, ["c"], 0.05)])
r = report(f"{d}/s.jsonl", "--costs", f"{d}/c.json", "--json")
assert r.returncode == 0, r.stderr
table = load_costs(f"{d}/c.json")
m = Message()
m.keys = "suite,a"
print(dict(table.costs))
assert message_key(m) in table, f"the producer's key {message_key(m)!r} is not in the learned table"
