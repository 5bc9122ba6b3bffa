"""The one runner of the adversarial reviews' scripts (tests/reviewNN/NN_name.py): each exits 0 once
its finding is fixed, and a hang is the finding's failure. test_reviewNN.py parametrizes over
:func:`scripts` and calls :func:`run_finding`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent


def scripts(folder: str) -> list[Path]:
    """The finding scripts of ``tests/<folder>``, in their numbered order."""
    return sorted((TESTS / folder).glob("[0-9][0-9]*_*.py"))


def run_finding(script: Path, timeout: float = 120) -> None:
    """Run ``script`` from its own folder with the checkout on the path; fail with its output's tail."""
    env = {**os.environ, "PYTHONPATH": str(TESTS.parent)}
    try:
        done = subprocess.run([sys.executable, script.name], cwd=script.parent, env=env, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{script.name} did not end (a hang is the finding's failure)")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
