"""Every program in examples/ runs as examples/README.md says, so a newcomer who starts there does
not meet one that drifted from the code (issue 33: the README's code was tested, the examples it
points to were not all run).

Each example is run by a test: the census below names it, and the named test file runs it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

EXAMPLES = REPO / "examples"
TIMEOUT = 180

# example -> the test file that runs it
RUN_BY = {
    "my_handler.py": "tests/test_readme.py",  # the README's "start here"
    "push_consumer.py": "tests/test_rocketmq_real.py",  # under opentelemetry-instrument
    "producer.py": "tests/test_examples.py",
    "consumer_loop.py": "tests/test_examples.py",
    "testcase_job.py": "tests/test_examples.py",
}


def test_every_example_is_run_by_a_test() -> None:
    found = {p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_")}
    assert found == set(RUN_BY), "a new example needs a test that runs it (and a row here)"
    for name, test in RUN_BY.items():
        text = (REPO / test).read_text(encoding="utf-8")
        assert f'"{name}"' in text or f'examples/{name}"' in text, f"{test} does not run examples/{name}"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The caller's environment without its exporter settings or metrics port; spans to nowhere;
    the 5.x client's log folder (created at import under $HOME) in the test's tmp dir."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RMQTRACE_"))}
    env.update(HOME=str(tmp_path), OTEL_TRACES_EXPORTER="none", PYTHONPATH=str(REPO), **extra)
    return env


def _run(name: str, tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True,
                          timeout=TIMEOUT, cwd=REPO, env=_env(tmp_path, **env), check=False)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, f"examples/{name}:\n{proc.stderr[-3000:]}"
    return proc


def test_the_incident_example_shows_the_incident_and_its_fix(tmp_path: Path) -> None:
    out = _run("testcase_job.py", tmp_path).stdout  # the two policies of the incident, as the README runs it
    assert "round_robin: consumer_wait (waiting inside the consumer)" in out, out
    assert "aggressive: consumer_wait (waiting inside the consumer) was 0%" in out, out


@pytest.mark.integration
def test_the_producer_and_the_consume_loop_examples_move_a_job(tmp_path: Path) -> None:
    """examples/README.md's "Run them", on a fresh topic and group: producer.py sends a job,
    consumer_loop.py handles and acks every message of it."""
    from rmq_real import ENDPOINT, ensure_broker, fresh_group, fresh_topic

    ensure_broker()
    topic, group, n = fresh_topic("examples"), fresh_group("examples"), 20
    sent = _run("producer.py", tmp_path, RMQ_ENDPOINT=ENDPOINT, RMQ_TOPIC=topic, JOB_GROUPS=str(n)).stdout
    assert f"sent {n} test-case groups" in sent, sent
    done = _run("consumer_loop.py", tmp_path, RMQ_ENDPOINT=ENDPOINT, RMQ_TOPIC=topic, RMQ_GROUP=group,
                WORKERS="4", CASE_MS="1", EXPECT=str(n)).stdout
    assert f"handled {n}, failed 0, acked {n}" in done, done
