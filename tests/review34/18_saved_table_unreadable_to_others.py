"""Promise (issue #34): `report --costs costs.json` writes the table the next run's producer reads;
the producer is often another service, run as another user.

Steps: umask 022 (the usual); save a table to a new costs.json, and over an existing 0644 one.

Expected: the file's mode is what any other write would give: 0644 for a new file (0666 & ~umask),
an existing file's own mode kept.
Actual: 0600 both times — the atomic save's temp file (mkstemp) keeps its private mode, so a
producer running as another user gets "cannot read (Permission denied)".
"""
import os
import stat
import tempfile

from tracer.dispatch.costtable import CostTable

os.umask(0o022)
d = tempfile.mkdtemp()
table = CostTable({"a": 1.0})
table.save(f"{d}/new.json")
with open(f"{d}/old.json", "w") as f:
    f.write("{}")
os.chmod(f"{d}/old.json", 0o644)
table.save(f"{d}/old.json")
modes = {name: oct(stat.S_IMODE(os.stat(f"{d}/{name}").st_mode)) for name in ("new.json", "old.json")}
print(modes)
assert modes == {"new.json": "0o644", "old.json": "0o644"}, modes
