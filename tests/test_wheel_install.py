"""The package as a user gets it: `make dist`'s sdist and wheel pass `twine check --strict`, and
the wheel installed into a fresh venv (not this checkout) runs `rmqtrace --version` and the
embedded example.

The fresh venv is made without pip and filled by this venv's pip (``pip --python``), so the test
costs one wheel build and one install from pip's cache (PyPI on a machine that has no cache yet).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import REPO

from tracer.version import __version__

pytest.importorskip("build", reason="the `dist` extra (build, twine) is part of the `test` extra")
pytest.importorskip("twine", reason="the `dist` extra (build, twine) is part of the `test` extra")


def _run(cmd: list[str], *, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith(
        ("OTEL_", "RMQTRACE_"))}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and wheel, built as `make dist` builds them."""
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "-q", "--outdir", str(out), str(REPO)], cwd=out)
    return out


def test_the_distributions_pass_twine_check(dist: Path) -> None:
    sdist = dist / f"rmqtrace-{__version__}.tar.gz"
    wheel = dist / f"rmqtrace-{__version__}-py3-none-any.whl"
    assert sdist.is_file() and wheel.is_file(), sorted(p.name for p in dist.iterdir())
    proc = _run([sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel)], cwd=dist)
    assert proc.stdout.count("PASSED") == 2, proc.stdout
    names = tarfile.open(sdist).getnames()
    assert f"rmqtrace-{__version__}/examples/my_handler.py" in names and f"rmqtrace-{__version__}/README.md" in names
    assert not [n for n in names if "/tests/" in n]  # the tests need the checkout's services and helpers


def test_the_wheel_installs_into_a_fresh_venv_and_runs(dist: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path)
    python = venv / "bin" / "python"
    wheel = dist / f"rmqtrace-{__version__}-py3-none-any.whl"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", str(wheel)], cwd=tmp_path)

    version = _run([str(venv / "bin" / "rmqtrace"), "--version"], cwd=tmp_path)
    assert version.stdout.strip() == f"rmqtrace {__version__}"
    where = _run([str(python), "-c", "import tracer; print(tracer.__file__)"], cwd=tmp_path).stdout.strip()
    assert Path(where).is_relative_to(venv), where  # the wheel's copy, not this checkout

    example = tmp_path / "my_handler.py"
    shutil.copy(REPO / "examples" / "my_handler.py", example)
    proc = _run([str(python), str(example)], cwd=tmp_path, timeout=120)
    assert "handled 40, failed 0, acked 40" in proc.stdout, proc.stdout
    assert "consumer_wait" in proc.stdout and "broker_wait" in proc.stdout

    # the real-broker benches need this checkout's services: from a wheel, one line and exit 1
    for bench in ("broker", "fleet"):
        cmd = [str(venv / "bin" / "rmqtrace"), "bench", bench, "--quick"] if bench == "fleet" else [
            str(venv / "bin" / "rmqtrace"), "bench", bench]
        failed = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False)
        assert failed.returncode == 1, (bench, failed.stdout, failed.stderr)
        assert failed.stderr.startswith(f"rmqtrace bench {bench}: ") and failed.stderr.count("\n") == 1, failed.stderr
