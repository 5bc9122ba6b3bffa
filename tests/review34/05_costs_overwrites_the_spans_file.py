"""Promise (common.md): loud early errors for arguments that cannot work; exit 2 for a bad argument.

Steps: `rmqtrace report s.jsonl --costs s.jsonl` (a slip of tab completion); the same with --html.

Expected: exit 2, one line: the output is the spans file being read; the spans file intact.
Actual: exit 0; the spans file (the only record of the run) is replaced by the cost table.
"""
import tempfile

from _spans import report, span, write

d = tempfile.mkdtemp()
for flag in ("--costs", "--html"):
    write(f"{d}/s.jsonl", [span(0, ["a"], 4.0), span(1, ["b"], 0.05)])
    before = open(f"{d}/s.jsonl").read()
    r = report(f"{d}/s.jsonl", flag, f"{d}/s.jsonl", "--json")
    print(flag, r.returncode, r.stderr.strip()[-300:])
    assert open(f"{d}/s.jsonl").read() == before, f"{flag} overwrote the spans file it read"
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (r.returncode, r.stderr)
