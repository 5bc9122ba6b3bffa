"""Promise (docs/dispatch.md "A failing key="): a key callable that returns anything but str or None
is loud (the dispatcher refuses that message, counted, logged). send_job's `key=` reads the table.

Steps: send_job / job_costs with cost=a CostTable({"tg-1": 5.0, ...}) and key= returning the key as
bytes (b"tg-1", what a 2.x client hands out), an int, a frozenset; then a key= that raises.

Expected: CostTableError naming the message and saying key= returned <type>, not a str or None;
a raising key= named as key=, not cost=.
Actual: a non-str key is looked up as is, misses, and silently takes the table's median — the
long message is sent in the middle; a raising key= is reported as "cost= raised ...".
"""
from tracer.dispatch.cost import job_costs
from tracer.dispatch.costtable import CostTable, CostTableError
from tracer.embedded import Message

table = CostTable({"tg-1": 5.0, "b": 1.0, "c": 2.0})
m = Message()
m.keys = "tg-1"
for junk in (b"tg-1", 7, frozenset({"tg-1"})):
    try:
        got = job_costs([m], table, key=lambda _m, j=junk: j)
    except CostTableError as exc:
        print("refused:", exc)
        assert "key=" in str(exc), exc
        continue
    raise SystemExit(f"key= returning {junk!r} silently took cost {got[0]} (the median)")
try:
    job_costs([m], table, key=lambda _m: 1 / 0)
except CostTableError as exc:
    print(exc)
    assert str(exc).startswith("key="), f"a raising key= is reported as: {exc}"
