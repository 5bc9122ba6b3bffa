"""The compiled build (``tracer.compiled``; ``make compiled``, ``python -m tracer.tools.compile``)
passes the tests of the code it compiles.

A mypyc-compiled module checks its annotations at run time where the sources check nothing: a
public argument typed narrower than what callers pass raises mypyc's ``TypeError`` there, and a
Python subclass meets compiled methods. The only way to know the compiled build behaves as the
sources do is to run the tests against it, so this module builds the copy once per tree of
sources (``.cache/compiled/<hash of the package, Python and mypy>``, reused until a source
changes) and runs :data:`SUBSET`, the tests of :data:`tracer.compiled.HOT_MODULES` that need no
service, in a subprocess from it. Its time is measured in BENCHMARKS.md ("Running the benchmarks").

Marked ``compiled``: skipped when there is no C compiler or no mypyc (``RMQTRACE_REQUIRE_COMPILED=1``
refuses the skip), deselected with ``-m "not compiled"``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tracer import compiled
from tracer.tools import compile as compile_tool

pytestmark = pytest.mark.compiled

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
CACHE = ROOT / ".cache" / "compiled"
KEEP_BUILDS = 3  # other trees' copies kept in the cache (worktrees share it), newest first


# The tests of the compiled modules (tracer.compiled.HOT_MODULES): their unit and model tests, the
# fuzzing of the message path, the census-driven checks of their public arguments and callables.
SUBSET: tuple[str, ...] = (
    "test_abandoned_handler.py", "test_batch_anchor.py", "test_blame_keep.py", "test_blame_release.py",
    "test_clock.py", "test_clock_steps.py", "test_collector_labels.py", "test_hold.py",
    "test_hold_age_and_late.py", "test_hold_expiry_skip.py", "test_keep.py", "test_metrics.py",
    "test_metrics_count_gaps.py", "test_model_keep.py", "test_not_started.py", "test_numeric_bounds.py",
    "test_processor_chain.py", "test_propagation.py", "test_reliability_input.py", "test_semconv_conformance.py",
    "test_shutdown_keeps_pending.py", "test_skew_bulk.py", "test_skew_window.py", "test_span_context_fast.py",
    "test_spans_written_at_end.py", "test_stamps.py", "test_telemetry.py", "test_telemetry_cost.py",
    "test_telemetry_faults.py", "test_tracer_config.py", "test_user_callables.py",
)
# Census tests that find the public parameters by inspect.signature, which a compiled function
# does not carry: they run on the sources, in the suite (their per-parameter checks run here).
DESELECTED: dict[str, str] = {
    "test_numeric_bounds.py::test_every_public_numeric_parameter_has_a_kind": "finds parameters by signature",
    "test_user_callables.py::test_every_public_callable_parameter_is_checked_or_says_why_not": "finds them by signature",
}




def _missing_toolchain() -> str | None:
    try:
        import mypyc  # noqa: F401
    except ImportError:
        return "mypyc is not installed (pip install mypy)"
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        return f"no C compiler ({cc})"
    return None


def _key() -> str:
    """The package's sources, the Python and the mypy that compile them."""
    import mypy.version

    h = hashlib.sha256(f"{sys.version}\n{mypy.version.__version__}\n".encode())
    package = Path(compile_tool.PACKAGE)
    for path in sorted(package.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".so":
            h.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _prune(keep: Path) -> None:
    builds = sorted((p for p in CACHE.iterdir() if p.is_dir() and p != keep and not p.name.endswith(".tmp")),
                    key=lambda p: p.stat().st_mtime, reverse=True)
    for old in builds[KEEP_BUILDS:]:
        shutil.rmtree(old, ignore_errors=True)


@pytest.fixture(scope="module")
def compiled_copy() -> Path:
    missing = _missing_toolchain()
    if missing is not None:
        if os.environ.get("RMQTRACE_REQUIRE_COMPILED") == "1":
            pytest.fail(f"RMQTRACE_REQUIRE_COMPILED=1 but {missing}")
        pytest.skip(missing)
    CACHE.mkdir(parents=True, exist_ok=True)
    dest = CACHE / _key()
    if not (dest / "tracer").is_dir():
        # built beside it and renamed: another worktree sharing .cache sees a whole copy or none
        tmp = CACHE / f"{dest.name}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        run = compile_tool.build(tmp)
        assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
        try:
            tmp.rename(dest)
        except OSError:  # the other worktree's build won
            shutil.rmtree(tmp, ignore_errors=True)
    os.utime(dest)
    _prune(dest)
    return dest


def _python(dest: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    # from dest: ``python -m`` puts the current directory first on the path, PYTHONPATH too
    env = {**os.environ, "PYTHONPATH": str(dest)}
    return subprocess.run([sys.executable, *args], cwd=dest, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_the_subset_and_its_deselections_name_tests_that_exist() -> None:
    assert all((TESTS / name).is_file() for name in SUBSET)
    for test in DESELECTED:
        name, _, function = test.partition("::")
        assert name in SUBSET and f"def {function}(" in (TESTS / name).read_text(), test


def test_every_hot_module_runs_compiled_from_the_copy(compiled_copy: Path) -> None:
    run = _python(compiled_copy, "-c", "import json; from tracer.compiled import compiled_modules;"
                  " print(json.dumps(compiled_modules()))", timeout=120)
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout)
    assert sorted(found) == sorted(compiled.HOT_MODULES), found
    assert not any(found.values()), f"stale: {found}"


def test_the_message_paths_tests_pass_against_the_compiled_copy(compiled_copy: Path) -> None:
    # the checkout's configuration (markers, timeout), and node ids relative to it for --deselect
    run = _python(compiled_copy, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", f"--rootdir={ROOT}",
                  "-c", str(ROOT / "pyproject.toml"), "-m", "not integration and not slow and not compiled",
                  *(f"--deselect=tests/{test}" for test in DESELECTED),
                  *(str(TESTS / name) for name in SUBSET), timeout=3000)
    tail = (run.stdout + run.stderr)[-6000:]
    assert run.returncode == 0, tail
