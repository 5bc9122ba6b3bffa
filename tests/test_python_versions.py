"""The supported Pythons (requires-python) are the ones CI runs, and the code runs on the oldest."""

from __future__ import annotations

import re
import sys

from conftest import REPO, pyproject


def _minors(text: str) -> set[str]:
    return set(re.findall(r"\b3\.1[0-9]\b", text))


def test_ci_runs_the_oldest_supported_python_and_the_newest_here() -> None:
    lowest = re.fullmatch(r">=\s*(3\.\d+)", pyproject()["project"]["requires-python"])
    assert lowest, "requires-python is expected as '>=3.X'"
    run = (REPO / ".ci" / "run").read_text()
    assert "make test" in run and "test-py" in run
    assert {lowest.group(1), "3.13"} <= _minors(run)
    assert pyproject()["tool"]["mypy"]["python_version"] == lowest.group(1)
    assert pyproject()["tool"]["ruff"]["target-version"] == "py" + lowest.group(1).replace(".", "")


def test_every_tomllib_import_has_the_310_fallback() -> None:
    """tomllib is new in 3.11: two tests imported it bare and failed on 3.10 (issue 33)."""
    bare = []
    for path in [*REPO.glob("tests/**/*.py"), *REPO.glob("tracer/**/*.py")]:
        text = path.read_text()
        if path.name != "test_python_versions.py" and re.search(r"^\s*import tomllib", text, re.M) \
                and "import tomli as tomllib" not in text:
            bare.append(str(path.relative_to(REPO)))
    assert bare == []
    if sys.version_info < (3, 11):
        assert pyproject()["project"]["name"] == "rmqtrace"  # the fallback itself, on the oldest Python
