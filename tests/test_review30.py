"""Run the loop review's scripts (tests/review30/README.md): each exits 0 once its finding is fixed.

The adversarial review of issue 30 (round 2, 2026-12-05) attacked the consume loop through the
public API; every finding also has its own test (named in RELIABILITY.md), so a script here failing
says which promise broke in the reviewer's words."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent / "review30"
SCRIPTS = sorted(HERE.glob("[0-9][0-9]*_*.py"))


def test_the_scripts_are_found() -> None:
    assert len(SCRIPTS) >= 5


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_the_finding_stays_fixed(script: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(HERE.parent.parent)}
    try:
        done = subprocess.run([sys.executable, script.name], cwd=HERE, env=env, capture_output=True, text=True,
                              timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{script.name} did not end (a hang is the finding's failure)")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
