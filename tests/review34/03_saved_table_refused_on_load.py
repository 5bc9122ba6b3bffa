"""Promise (issue #34, report --help): `report --costs` writes a table the producer reads back; the
table is size-bounded (MAX_ENTRIES keys of up to MAX_KEY_CHARS characters, a file of MAX_BYTES).

Steps: learn_costs over 40 000 keys of 256 characters (well under MAX_ENTRIES, each key legal),
save() it, load_costs() it.

Expected: what save() writes loads back — or save() refuses the table (CostTableError) and writes nothing.
Actual: save() writes ~10.6 MB; load_costs refuses it "larger than 8388608 bytes; not a cost table".
The bounds disagree: 100 000 keys x 256 characters (x6 for \\u escapes) is far beyond 8 MiB.
"""
import os
import tempfile

from tracer.dispatch.costtable import CostTableError, learn_costs, load_costs

table = learn_costs((f"{i:06d}" + "k" * 250, 1.0) for i in range(40_000))
path = os.path.join(tempfile.mkdtemp(), "costs.json")
try:
    table.save(path)
except CostTableError as exc:
    assert not os.path.exists(path), "refused, yet a file was written"
    print("refused at save:", exc)
    raise SystemExit(0)
try:
    back = load_costs(path)
except CostTableError as exc:
    raise SystemExit(f"save() wrote {os.path.getsize(path)} bytes that load_costs refuses: {exc}") from None
assert back.costs == table.costs
