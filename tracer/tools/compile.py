"""``python -m tracer.tools.compile DEST``: a copy of the ``tracer`` package in ``DEST`` with
:data:`tracer.compiled.HOT_MODULES` compiled by mypyc (needs mypy and a C compiler: the
``compiled`` extra; ``make compiled`` builds ``build/compiled``). Run from it, or with it first on
``PYTHONPATH`` (docs/settings.md, "Compiled build"); ``cd DEST && python -m tracer bench overhead``
measures it.

The checkout it is run from is not touched: an extension module is imported before the ``.py``
beside it, so one built in place would hide every later edit of its source. Exit 2 when ``DEST``
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


# mypycify with one named group: ``separate`` turns mypyc's whole-program class analysis off, so a
# compiled method checks ``self`` with isinstance() and a Python subclass of MessageTracer passes (with
# it on, mypyc knows every subclass in the build and checks the exact type: mypyc honours
# allow_interpreted_subclasses only on its native classes). One group keeps the calls between the
# modules direct.
_SETUP = """\
from setuptools import setup
from mypyc.build import mypycify

setup(name="rmqtrace_compiled", ext_modules=mypycify({sources!r}, opt_level="3",
      separate=[({sources!r}, "rmqtrace")]))
"""


def build(dest: Path) -> subprocess.CompletedProcess[str]:
    """Copy the package to ``dest/tracer`` and compile :data:`HOT_MODULES` there (mypyc's C sources
    go to ``dest/build``, its runtime library beside the package)."""
    shutil.copytree(PACKAGE, dest / "tracer", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    # pyproject.toml's [tool.mypy], which an installed package has not got: the clients' untyped imports
    (dest / "mypy.ini").write_text("[mypy]\nstrict = True\nwarn_unused_ignores = False\n\n"
                                   "[mypy-rocketmq.*,wrapt.*]\nignore_missing_imports = True\n")
    sources = [os.path.join(*m.split(".")) + ".py" for m in HOT_MODULES]
    (dest / "build").mkdir()
    (dest / "build" / "setup.py").write_text(_SETUP.format(sources=sources))
    return subprocess.run([sys.executable, os.path.join("build", "setup.py"), "build_ext", "--inplace"],
                          cwd=dest, capture_output=True, text=True)


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
