"""Promise (costtable.py): a cost table is "safe to load from a file someone else wrote": bad input is
refused with one CostTableError naming the file.

Steps: someone puts a FIFO where costs.json should be; load_costs(that path) in a child process.

Expected: CostTableError "<path>: not a regular file (a FIFO)" at once.
Actual: open() of a FIFO blocks until a writer comes: the producer hangs for ever before sending.
"""
import os
import subprocess
import sys
import tempfile

d = tempfile.mkdtemp()
fifo = os.path.join(d, "costs.json")
os.mkfifo(fifo)
code = f"""
from tracer.dispatch.costtable import CostTableError, load_costs
try:
    load_costs({fifo!r})
except CostTableError as exc:
    print(exc); raise SystemExit(0)
raise SystemExit('loaded a FIFO')
"""
try:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
except subprocess.TimeoutExpired:
    raise SystemExit("load_costs(a FIFO) hung") from None
print(done.stdout, done.stderr)
assert done.returncode == 0 and "FIFO" in done.stdout, "no one-line refusal naming the FIFO"
