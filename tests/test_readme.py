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
    # a first real run that prints a traceback looks like a crash, even when it exits 0 (issue 33)
    assert "Traceback" not in proc.stderr, f"README.md line {line}:\n{proc.stderr[-3000:]}"


@pytest.mark.integration
@pytest.mark.parametrize("what", ["broker-down", "topic-missing"])
def test_the_readme_program_without_its_broker_or_topic_says_which_in_its_last_line(what: str, tmp_path: Path) -> None:
    """It died with the client's "failed to fetch topic:jobs route." for both (issue 33)."""
    from rmq_real import ensure_broker, fresh_group, unique

    ensure_broker()
    line, code = BROKER[0]
    topic = unique("readme-missing")
    code = code.replace('"jobs"', f'"{topic}"').replace('"workers"', f'"{fresh_group("readme")}"')
    if what == "broker-down":
        code = code.replace('"127.0.0.1:8081"', '"127.0.0.1:1"')
        says = "no RocketMQ proxy answers at 127.0.0.1:1: start one (`make stack`"
    else:
        says = (f"topic {topic!r} does not exist on the broker at 127.0.0.1:8081: "
                f"create it (`bash services/rocketmq/rmq.sh topic {topic}`")
    proc = _run(code, tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("tracer.clients.route.TopicRouteError: ") and says in last, proc.stderr[-3000:]
    assert "failed to fetch" not in proc.stderr, proc.stderr[-3000:]


def test_the_copyable_handler_example_runs(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "my_handler.py")], capture_output=True, text=True,
                          timeout=TIMEOUT, env=_env(tmp_path), check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "handled 40, failed 0, acked 40" in proc.stdout
    assert re.search(r"consumer_wait: 40 messages, mean [\d.]+ ms", proc.stdout), proc.stdout
    means = {g: float(m) for g, m in re.findall(r"(\w+): 40 messages, mean ([\d.]+) ms", proc.stdout)}
    parts = ("send", "broker_wait", "consumer_wait", "handler")
    assert set(parts) < set(means), proc.stdout  # every part of end_to_end is printed ...
    # ... and they add up, to the broker store time's 1 ms resolution (a negative send is reported as 0)
    assert sum(means[p] for p in parts) == pytest.approx(means["end_to_end"], abs=1.0), means


def test_the_readme_names_what_it_documents() -> None:
    text = README.read_text(encoding="utf-8")
    for needle in ("pip install -e '/path/to/rmqtrace[rocketmq]'", "make dist",
                   "consumer.startup()", "tracer.testing", "examples/my_handler.py",
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


def test_the_readme_leads_with_an_install_that_works_today() -> None:
    """The package is not on PyPI: the first install the README shows is the clone's, and the PyPI
    form is said to be future."""
    text = README.read_text(encoding="utf-8")
    first_sh = re.search(r"^```sh\n(.*?)^```", text, re.S | re.M)
    assert first_sh and "make demo" in first_sh.group(1) and "not on PyPI yet" in text.split("```sh")[0]
    using = text.split("## Using it")[1].split("```python")[0]
    first_pip = re.search(r"^pip install (.*)$", using, re.M)
    assert first_pip and "/path/to/rmqtrace" in first_pip.group(1), first_pip
    assert "is not yet" in using


def test_every_variable_the_code_reads_is_in_the_settings_table() -> None:
    """Discovered from the source: every RMQTRACE_* / RMQ_* name in tracer/ (a name ending in _ is a
    prefix, named as PREFIX*) has a row in the README's settings table."""
    names = set()
    for path in [*(REPO / "tracer").rglob("*.py"), REPO / "examples" / "_env.py"]:
        names |= set(re.findall(r"[\"'](RMQ(?:TRACE)?_[A-Z_]+)[\"']", path.read_text(encoding="utf-8")))
    settings = README.read_text(encoding="utf-8").split("### Settings")[1].split("\n### ")[0]
    rows = set(re.findall(r"^\| `(RMQ[A-Z_]*\*?)`", settings, re.M))
    missing = sorted(n for n in names if n not in rows and not any(r.endswith("*") and n.startswith(r[:-1]) for r in rows)
                     and n.removesuffix("_") + "_*" not in rows)
    missing = [n for n in missing if n not in ("RMQ_TOPIC", "RMQ_GROUP") or n not in settings]
    assert not missing, f"read by the code, not in README's settings table: {missing}"
    assert {"RMQTRACE_OUT", "RMQTRACE_CHROMIUM", "RMQ_ENDPOINT"} <= rows
