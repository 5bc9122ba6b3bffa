"""``python -m tracer.tools.compile DEST``: a copy of the ``tracer`` package in ``DEST`` with
:data:`tracer.compiled.HOT_MODULES` compiled by mypyc (needs mypy and a C compiler), to measure:
``cd DEST && python -m tracer bench overhead`` (the current directory comes first on the path).

The checkout it is run from is not touched: an extension module is imported before the ``.py``
beside it, so one built in place would hide every later edit of its source. Not a supported way to
run rmqtrace: the compiled modules enforce their annotations at run time and differ from the
sources where the tests name (docs/benchmarks-history.md, "Session 10"). Exit 2 when ``DEST``
exists, 1 when the build fails."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ..compiled import HOT_MODULES

__all__ = ["build", "main"]

PACKAGE = Path(__file__).resolve().parents[1]  # the tracer package this runs from


def build(dest: Path) -> subprocess.CompletedProcess[str]:
    """Copy the package to ``dest/tracer`` and compile :data:`HOT_MODULES` there (mypyc's C sources
    go to ``dest/build``, its runtime library beside the package)."""
    shutil.copytree(PACKAGE, dest / "tracer", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    # pyproject.toml's [tool.mypy], which an installed package has not got: the clients' untyped imports
    (dest / "mypy.ini").write_text("[mypy]\nstrict = True\nwarn_unused_ignores = False\n\n"
                                   "[mypy-rocketmq.*,wrapt.*]\nignore_missing_imports = True\n")
    mypyc = shutil.which("mypyc") or os.path.join(os.path.dirname(sys.executable), "mypyc")
    sources = [os.path.join(*m.split(".")) + ".py" for m in HOT_MODULES]
    return subprocess.run([mypyc, *sources], cwd=dest, capture_output=True, text=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tracer.tools.compile",
                                description="a copy of rmqtrace with its per-message path compiled by mypyc")
    p.add_argument("dest", type=Path, help="a directory that does not exist yet")
    args = p.parse_args(argv)
    if args.dest.exists():
        print(f"rmqtrace compile: {args.dest} exists: give a new directory", file=sys.stderr)
        return 2
    try:
        run = build(args.dest)
    except OSError as exc:
        print(f"rmqtrace compile: {exc}", file=sys.stderr)
        return 1
    if run.returncode != 0:
        last = (run.stdout + run.stderr).strip().splitlines()[-1:] or ["no output"]
        print(f"rmqtrace compile: mypyc failed: {last[0]}", file=sys.stderr)
        return 1
    print(f"compiled {len(HOT_MODULES)} modules in {args.dest}: cd {args.dest} && python -m tracer bench overhead")
    return 0


if __name__ == "__main__":
    sys.exit(main())
