"""Promise (issue #34, report --help): `report --costs` writes a table the producer reads back,
keyed by the message's first key.

Steps: a run whose 4 s message has a 300-character key K (legal for RocketMQ); the consumer records
message keys capped at 256 characters (semconv.md). `report --costs`, then the producer's lookup of
K in the loaded table (send_job's cost=table reads table.cost(message_key(m))).

Expected: K costs 4 s (the table holds what the span recorded, K's first 256 characters, and the
lookup reads K the same way), so it is sent first.
Actual: the table holds K[:256]: 4.0 (the capped key passes the table's 256-character check), the
producer looks up the whole K, misses, and K takes the median.
"""
import tempfile

from _spans import report, span, write

from tracer.dispatch.costtable import load_costs

K = "suite-" + "x" * 294
d = tempfile.mkdtemp()
write(f"{d}/s.jsonl", [span(0, [K[:256]], 4.0), span(1, ["b"], 0.05), span(2, ["c"], 0.05)])
r = report(f"{d}/s.jsonl", "--costs", f"{d}/c.json", "--json")
assert r.returncode == 0, r.stderr
table = load_costs(f"{d}/c.json")
print(dict(table.costs).keys(), table.cost(K))
assert table.cost(K) == 4.0, f"the long key takes {table.cost(K)} (the default), not its learned 4.0"
