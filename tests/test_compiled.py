"""tracer.compiled and ``python -m tracer.tools.compile``: the hints change nothing when the sources
run, the suite runs the sources, and the compile tool never writes into an existing directory.
(The mypyc build itself, and the message path's tests run against it: tests/test_compiled_build.py.)"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from tracer import compiled
from tracer.tools import compile as compile_tool


def test_every_hot_module_is_a_module_of_the_package() -> None:
    for name in compiled.HOT_MODULES:
        assert importlib.import_module(name).__name__ == name


def test_the_suite_runs_the_sources_not_a_compiled_copy() -> None:
    assert compiled.compiled_modules() == {}


def test_without_mypy_extensions_a_hint_leaves_the_class_as_it_is() -> None:
    class C:
        pass

    assert compiled._no_hints(native_class=False, allow_interpreted_subclasses=True)(C) is C


def test_an_existing_destination_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    assert compile_tool.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "exists" in err
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]
