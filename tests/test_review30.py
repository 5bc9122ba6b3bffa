"""Run the loop review's scripts (tests/review30/README.md): each exits 0 once its finding is fixed.

The adversarial review of issue 30 (round 2, 2026-12-05) attacked the consume loop through the
public API; every finding also has its own test (named in RELIABILITY.md), so a script here failing
says which promise broke in the reviewer's words."""

from __future__ import annotations

from pathlib import Path

import pytest
from review_scripts import run_finding, scripts

SCRIPTS = scripts("review30")


def test_the_scripts_are_found() -> None:
    assert len(SCRIPTS) >= 12  # the twelve findings of 2026-12-05


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_the_finding_stays_fixed(script: Path) -> None:
    run_finding(script)
