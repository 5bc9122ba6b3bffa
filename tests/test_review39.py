"""Run the review of the PRIORITY change (tests/review39/README.md): each script exits 0 once its
finding is fixed. The review (2026-12-05) attacked ``send_job(priority_levels=)``, PRIORITY topics
and the embedded broker through the public API; all nine findings are fixed (RELIABILITY.md, "The
PRIORITY review")."""

from __future__ import annotations

from pathlib import Path

import pytest
from review_scripts import run_finding, scripts

SCRIPTS = scripts("review39")


def test_the_scripts_are_found() -> None:
    assert len(SCRIPTS) >= 9


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_the_finding_stays_fixed(script: Path) -> None:
    run_finding(script)
