"""Promise (issue #34): costs are learned from the last run; `report --costs` writes the table the
next run's send_job reads. Exit 1 for a failed run.

Steps: costs.json holds a good table from an earlier run. A run whose messages carry no message key
(keys not set, or all refused): `rmqtrace report s.jsonl --costs costs.json`.

Expected: nothing can be learned: exit 1, one line saying why; costs.json untouched.
Actual: exit 0, "costs: 0 keys ... written", costs.json replaced by an empty table: the next run's
send_job silently sends every job in arrival order (every cost is the empty table's default 0).
"""
import json
import tempfile

from _spans import report, span, write

d = tempfile.mkdtemp()
write(f"{d}/s.jsonl", [span(0, None, 4.0), span(1, None, 0.05)])
good = '{"format":"rmqtrace.costs","version":1,"costs":{"a":3.0}}'
with open(f"{d}/costs.json", "w") as f:
    f.write(good)
r = report(f"{d}/s.jsonl", "--costs", f"{d}/costs.json", "--json")
print(r.returncode, r.stderr.strip()[-300:])
assert json.loads(open(f"{d}/costs.json").read()) == json.loads(good), "the earlier table was overwritten"
assert r.returncode == 1, r.returncode
