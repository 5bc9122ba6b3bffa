"""Promise (report --help): --costs FILE writes the table to FILE. A FILE that is a symlink (a shared
costs.json, or /dev/stdout -> /proc/self/fd/1 to pipe it into jq) is written through.

Steps: a spans file; `report --costs LINK` with LINK -> real.json; `report --costs OUT` with
OUT -> /proc/self/fd/1 (what /dev/stdout is).

Expected: real.json holds the table and LINK is still the link; the table appears on stdout.
Actual: the atomic save replaces the link itself with a regular file: real.json keeps its old
content and nothing reaches stdout. As root, `--costs /dev/stdout` creates a temp file in /dev and
replaces the system's /dev/stdout symlink.
"""
import os
import tempfile

from _spans import report, span, write

d = tempfile.mkdtemp()
write(f"{d}/s.jsonl", [span(0, ["a"], 4.0), span(1, ["b"], 0.05)])
real = f"{d}/real.json"
with open(real, "w") as f:
    f.write("old\n")
os.symlink(real, f"{d}/link.json")
r = report(f"{d}/s.jsonl", "--costs", f"{d}/link.json", "--json")
print(r.returncode, r.stderr[-300:])
assert os.path.islink(f"{d}/link.json"), "the symlink was replaced by a regular file"
assert "rmqtrace.costs" in open(real).read(), "the link's target was not written"
os.symlink("/proc/self/fd/1", f"{d}/stdout")
r = report(f"{d}/s.jsonl", "--costs", f"{d}/stdout")
print(r.returncode, r.stderr[-300:])
assert os.path.islink(f"{d}/stdout"), "the /dev/stdout-like link was replaced by a regular file"
assert '"rmqtrace.costs"' in r.stdout, "the table did not reach stdout"
