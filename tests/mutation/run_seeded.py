"""Apply each hand-written seeded bug (tests/mutation/seeded_bugs.toml) to a copy of the tree and
check that a named invariant of the model tests catches it.

A bug is *caught* when its test run fails and the output names its invariant
(``invariant <caught_by>:``) with no pytest-timeout in it; *missed* when the tests pass; *other*
when they fail some other way (a helper's timeout, a different assertion). Exit 1 unless every
bug is caught. The working tree is never touched (others may be running tests in it).

Usage: python tests/mutation/run_seeded.py [NAME_SUBSTRING ...] [--json]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the backport the test extra installs there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
BUGS = ROOT / "tests" / "mutation" / "seeded_bugs.toml"
COPY = ("tracer", "tests", "pyproject.toml")
PER_BUG_TIMEOUT_S = 300


def load() -> list[dict[str, str]]:
    with BUGS.open("rb") as f:
        bugs: list[dict[str, str]] = tomllib.load(f)["bug"]
    names = [b["name"] for b in bugs]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise SystemExit(f"seeded_bugs.toml: duplicate names {sorted(dup)}")
    for b in bugs:
        missing = {"name", "file", "find", "replace", "tests", "caught_by"} - set(b)
        if missing:
            raise SystemExit(f"seeded_bugs.toml: {b.get('name', '?')} lacks {sorted(missing)}")
    return bugs


def run_one(tree: Path, bug: dict[str, str]) -> tuple[str, str, float]:
    path = tree / bug["file"]
    original = path.read_text()
    n = original.count(bug["find"])
    if n != 1:
        return "not-applied", f"`find` occurs {n} times in {bug['file']}", 0.0
    path.write_text(original.replace(bug["find"], bug["replace"]))
    t0 = time.monotonic()
    try:
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
               f"--timeout={PER_BUG_TIMEOUT_S // 2}", *bug["tests"].split()]  # fmt: skip
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "RMQTRACE_SEEDED": "1"}
        try:
            p = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=PER_BUG_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return "other", "the run itself timed out", time.monotonic() - t0
        out = p.stdout + p.stderr
        took = time.monotonic() - t0
        if p.returncode == 0:
            return "missed", "the tests passed", took
        # caught_by may name alternatives ("a|b"): the invariant that trips first depends on the
        # step the search reached, and any of the promise's named invariants is a catch
        names = [f"invariant {n.strip()}:" for n in bug["caught_by"].split("|")]
        if "Timeout" in out and "+++++" in out:
            return "other", "pytest-timeout fired", took
        hit = next((nm for nm in names if nm in out), None)
        if hit is not None:
            return "caught", hit, took
        first = next((ln for ln in out.splitlines() if ln.startswith("E ")), "no assertion line")
        return "other", first[:200], took
    finally:
        path.write_text(original)


def main(argv: list[str]) -> int:
    as_json = "--json" in argv
    picks = [a for a in argv if not a.startswith("--")]
    bugs = [b for b in load() if not picks or any(p in b["name"] for p in picks)]
    results = []
    with tempfile.TemporaryDirectory(prefix="rmqtrace-seeded-") as tmp:
        tree = Path(tmp)
        for name in COPY:
            src = ROOT / name
            if src.is_dir():
                shutil.copytree(src, tree / name, ignore=shutil.ignore_patterns("__pycache__", ".hypothesis"))
            else:
                shutil.copy2(src, tree / name)
        for b in bugs:
            verdict, why, took = run_one(tree, b)
            results.append({"name": b["name"], "verdict": verdict, "why": why, "seconds": round(took, 1)})
            if not as_json:
                print(f"{verdict:12} {b['name']:48} {took:6.1f}s  {why}", flush=True)
    caught = sum(r["verdict"] == "caught" for r in results)
    if as_json:
        print(json.dumps({"caught": caught, "total": len(results), "bugs": results}))
    else:
        print(f"caught {caught} of {len(results)} by a named invariant")
    return 0 if caught == len(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
