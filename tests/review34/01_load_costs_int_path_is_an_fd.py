"""Promise (costtable.py, docs/dispatch.md): the cost table is "safe to load from a file someone else
wrote"; common.md: loud early errors for arguments that cannot work.

Steps: load_costs(r) with r an int (the read end of a pipe holding a valid table); then load_costs(True).

Expected: TypeError (a path is a str or os.PathLike), no file descriptor touched.
Actual: open() takes an int as a file descriptor: load_costs(r) reads the pipe, returns its table,
and closes the caller's descriptor; load_costs(True) reads fd 1 and closes the process's stdout.
"""
import os

from tracer.dispatch.costtable import load_costs

r, w = os.pipe()
os.write(w, b'{"format":"rmqtrace.costs","version":1,"costs":{"a":1}}')
os.close(w)
try:
    load_costs(r)
except TypeError as exc:
    print("refused:", exc)
else:
    raise SystemExit("load_costs(an int) read a file descriptor as a path")
try:
    os.fstat(r)
except OSError:
    raise SystemExit("load_costs(an int) closed the caller's file descriptor") from None
os.close(r)
for junk in (True, 3.5, None, b"\xff/nope"):
    try:
        load_costs(junk)  # type: ignore[arg-type]
    except TypeError:
        continue
    except Exception as exc:  # noqa: BLE001
        raise SystemExit(f"load_costs({junk!r}): {type(exc).__name__}: {exc}, not a TypeError") from None
    raise SystemExit(f"load_costs({junk!r}) was taken")
print("ok")
