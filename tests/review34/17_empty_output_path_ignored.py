"""Promise (common.md, report --help): a bad argument is one line and exit 2; --costs FILE "also
write[s] the cost table".

Steps: `rmqtrace report s.jsonl --costs ""` (an unset shell variable: --costs "$OUT"); the same for
--html and --png.

Expected: exit 2, one line: the path is empty.
Actual: exit 0 and nothing written: an empty path is taken as "not asked".
"""
import tempfile

from _spans import report, span, write

d = tempfile.mkdtemp()
write(f"{d}/s.jsonl", [span(0, ["a"], 4.0), span(1, ["b"], 0.05)])
for flag in ("--costs", "--html", "--png"):
    r = report(f"{d}/s.jsonl", flag, "", "--json")
    print(flag, r.returncode, r.stderr.strip()[-200:])
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, f"{flag} '': exit {r.returncode}"
