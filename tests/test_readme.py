"""The README's Python code runs as written, so it cannot drift from the code.

Every ```python block of README.md is run in a fresh interpreter. The convention for a block that
needs more than Python: its first line is a comment ``# needs a RocketMQ 5 proxy …``. Such a block
runs against the real local broker (an ``integration`` test): the only change made to it is the
topic and group names ("jobs", "workers") replaced by fresh ones, because a new group reads a topic
from its start and a shared topic would hand it other runs' messages. Any other ``# needs …`` first
line fails the test: a new kind of prerequisite must be given a runner here, not skipped quietly.
The examples named in the README run too.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

README = REPO / "README.md"
NEEDS_BROKER = "# needs a RocketMQ 5 proxy"
TIMEOUT = 120  # s for one block: a real broker's first receive waits for the proxy's settings


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(line number, code) of every ```python block."""
    return [(text[:m.start()].count("\n") + 2, m.group(1)) for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M)]


BLOCKS = python_blocks(README.read_text(encoding="utf-8"))
PLAIN = [(line, code) for line, code in BLOCKS if not code.startswith("# needs")]
BROKER = [(line, code) for line, code in BLOCKS if code.startswith(NEEDS_BROKER)]


def _env(tmp_path: Path) -> dict[str, str]:
    """No exporter or metrics port from the caller's environment; the 5.x client's log folder
    (created at import under $HOME) kept in the test's tmp dir."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RMQTRACE_"))}
    env.update(HOME=str(tmp_path), OTEL_TRACES_EXPORTER="none", PYTHONPATH=str(REPO))
    return env


def _run(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "block.py"
    script.write_text(code, encoding="utf-8")
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=TIMEOUT,
                          cwd=tmp_path, env=_env(tmp_path), check=False)


def test_the_readme_has_code_and_every_block_is_run_or_needs_a_known_service() -> None:
    assert len(BLOCKS) >= 2 and BROKER and PLAIN
    unknown = [line for line, code in BLOCKS if code.startswith("# needs") and not code.startswith(NEEDS_BROKER)]
    assert unknown == [], f"README blocks at lines {unknown} need something this test cannot provide"


@pytest.mark.parametrize(("line", "code"), PLAIN, ids=[f"README.md:{line}" for line, _ in PLAIN])
def test_readme_block_runs_as_written(line: int, code: str, tmp_path: Path) -> None:
    proc = _run(code, tmp_path)
    assert proc.returncode == 0, f"README.md line {line}:\n{proc.stderr[-3000:]}"


@pytest.mark.integration
@pytest.mark.parametrize(("line", "code"), BROKER, ids=[f"README.md:{line}" for line, _ in BROKER])
def test_readme_block_runs_against_the_real_broker(line: int, code: str, tmp_path: Path) -> None:
    from rmq_real import ensure_broker, fresh_group, fresh_topic

    ensure_broker()
    topic, group = fresh_topic("readme"), fresh_group("readme")
    renamed = code.replace('"jobs"', f'"{topic}"').replace('"workers"', f'"{group}"')
    assert renamed.count(topic) >= 3 and renamed.count(group) >= 2  # the names were there to replace
    proc = _run(renamed, tmp_path)
    assert proc.returncode == 0, f"README.md line {line}:\n{proc.stderr[-3000:]}"
    assert "running 3 cases of" in proc.stdout, proc.stdout


def test_the_copyable_handler_example_runs(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "my_handler.py")], capture_output=True, text=True,
                          timeout=TIMEOUT, env=_env(tmp_path), check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "handled 40, failed 0, acked 40" in proc.stdout
    assert re.search(r"consumer_wait: 40 messages, mean [\d.]+ ms", proc.stdout), proc.stdout


def test_the_readme_names_what_it_documents() -> None:
    text = README.read_text(encoding="utf-8")
    for needle in ("pip install 'rmqtrace[rocketmq]'", "consumer.startup()", "tracer.testing", "examples/my_handler.py",
                   "consumer_wait", "rmqtrace_clock_skew_bound_seconds"):
        assert needle in text, needle


def test_the_readme_sample_output_agrees_with_itself() -> None:
    """The demo's sample: each policy's × LB is its job time over its lower bound, and the
    where-the-time-went line repeats the table's ratio and consumer_wait share."""
    text = README.read_text(encoding="utf-8")
    rows = re.findall(r"^ (\w+) +([\d.]+) s +([\d.]+) s +([\d.]+) +(\d+)% +(\d+)% +\d+$", text, re.M)
    assert {r[0] for r in rows} == {"round_robin", "aggressive", "cost_aware"}, rows
    lines = " ".join(text.split())
    for policy, job, lb, ratio, busy, wait in rows:
        assert float(job) / float(lb) == pytest.approx(float(ratio), abs=0.006), policy
        said = re.search(rf"• {policy}: consumer_wait \(waiting inside the consumer\) was (\d+)% .*?took ([\d.]+)× "
                         r"the lower bound, workers busy (\d+)%", lines)
        if said:
            assert said.groups() == (wait, ratio, busy), policy
