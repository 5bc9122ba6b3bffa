"""The README's Python code runs as written, so it cannot drift from the code.

Every ```python block of README.md is run in a fresh interpreter. The convention for a block that
needs more than Python: its first line is a comment ``# needs a RocketMQ 5 proxy …``. Such a block
runs against the real local broker (an ``integration`` test): the only change made to it is the
topic and group names ("jobs", "workers") replaced by fresh ones, because a new group reads a topic
from its start and a shared topic would hand it other runs' messages. Any other ``# needs …`` first
line fails the test: a new kind of prerequisite must be given a runner here, not skipped quietly.
The examples named in the README run too.

Every ```sh line is a command that exists as written: a make target of the Makefile, a services/
script's subcommand, a pip install of the clone with extras pyproject.toml declares, an `rmqtrace`
command line its parser takes, a Python script there is. The quick start's path to a trace runs
for real (an integration test).
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

README = REPO / "README.md"
SETTINGS = REPO / "docs" / "settings.md"
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


def block_failed(proc: subprocess.CompletedProcess[str]) -> str | None:
    """Why a block's run failed, or None: an exit status, or a traceback on stderr even with exit
    0 — a first run that prints one reads as a crash to whoever copied the block (issue 33)."""
    if proc.returncode != 0:
        return f"exit {proc.returncode}:\n{proc.stderr[-3000:]}"
    if "Traceback (most recent call last)" in proc.stderr:
        return f"exit 0 with a traceback on stderr:\n{proc.stderr[-3000:]}"
    return None


def test_a_block_that_prints_a_traceback_and_exits_0_fails(tmp_path: Path) -> None:
    logged = "import logging\ntry:\n    1 / 0\nexcept ZeroDivisionError:\n    logging.exception('startup race')\n"
    assert "traceback on stderr" in (block_failed(_run(logged, tmp_path)) or "")
    assert block_failed(_run("import sys\nprint('a warning', file=sys.stderr)\n", tmp_path)) is None


def test_the_readme_has_code_and_every_block_is_run_or_needs_a_known_service() -> None:
    assert len(BLOCKS) >= 2 and BROKER and PLAIN
    unknown = [line for line, code in BLOCKS if code.startswith("# needs") and not code.startswith(NEEDS_BROKER)]
    assert unknown == [], f"README blocks at lines {unknown} need something this test cannot provide"


@pytest.mark.parametrize(("line", "code"), PLAIN, ids=[f"README.md:{line}" for line, _ in PLAIN])
def test_readme_block_runs_as_written(line: int, code: str, tmp_path: Path) -> None:
    failed = block_failed(_run(code, tmp_path))
    assert failed is None, f"README.md line {line}: {failed}"


@pytest.mark.integration
@pytest.mark.parametrize(("line", "code"), BROKER, ids=[f"README.md:{line}" for line, _ in BROKER])
def test_readme_block_runs_against_the_real_broker(line: int, code: str, tmp_path: Path) -> None:
    from rmq_real import ensure_broker, fresh_group, fresh_topic

    ensure_broker()
    topic, group = fresh_topic("readme"), fresh_group("readme")
    renamed = code.replace('"jobs"', f'"{topic}"').replace('"workers"', f'"{group}"')
    assert renamed.count(topic) >= 3 and renamed.count(group) >= 2  # the names were there to replace
    proc = _run(renamed, tmp_path)
    assert block_failed(proc) is None, f"README.md line {line}: {block_failed(proc)}"
    assert "running 3 cases of" in proc.stdout, proc.stdout


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


def _comparable(text: str) -> str:
    """Text with the terminal's table borders and wrapping gone and every number a #."""
    text = re.sub(r"[│┃┏┓┗┛┡┩└┘┌┐━─╇┳┻┴┬╈┼]", " ", text)
    return " ".join(re.sub(r"\d+(\.\d+)?", "#", text).split())


def test_the_readme_demo_sample_is_what_the_demo_prints(tmp_path: Path) -> None:
    """The sample under "The blind spot" is checked for its own sums above; this holds its words to
    the command's: every piece of it between two elisions (…) is in a real run's output, numbers
    aside (a small job: the verdicts are the full one's)."""
    text = README.read_text(encoding="utf-8")
    sample = re.search(r"^```\n( policy .*?)^```", text, re.S | re.M)
    assert sample, "the README shows the demo's output"
    env = {k: v for k, v in _env(tmp_path).items() if k != "OTEL_TRACES_EXPORTER"}
    proc = subprocess.run([sys.executable, "-m", "tracer", "demo", "--groups", "120", "--workers", "4", "--case-ms", "1"],
                          capture_output=True, text=True, timeout=TIMEOUT, cwd=tmp_path, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = _comparable(proc.stdout)
    pieces = [_comparable(p) for p in sample.group(1).split("…")]
    missing = [p for p in pieces if p and p not in printed]
    assert missing == [], f"README demo sample pieces the demo does not print: {missing}\n---\n{printed}"


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
    prefix, named as PREFIX*) has a row in the settings table (docs/settings.md, linked from the README)."""
    names = set()
    for path in [*(REPO / "tracer").rglob("*.py"), REPO / "examples" / "_env.py"]:
        names |= set(re.findall(r"[\"'](RMQ(?:TRACE)?_[A-Z_]+)[\"']", path.read_text(encoding="utf-8")))
    settings = SETTINGS.read_text(encoding="utf-8").split("## Settings")[1].split("\n## ")[0]
    rows = set(re.findall(r"^\| `(RMQ[A-Z_]*\*?)`", settings, re.M))
    missing = sorted(n for n in names if n not in rows and not any(r.endswith("*") and n.startswith(r[:-1]) for r in rows)
                     and n.removesuffix("_") + "_*" not in rows)
    missing = [n for n in missing if n not in ("RMQ_TOPIC", "RMQ_GROUP") or n not in settings]
    assert not missing, f"read by the code, not in docs/settings.md's settings table: {missing}"
    assert {"RMQTRACE_OUT", "RMQTRACE_CHROMIUM", "RMQ_ENDPOINT"} <= rows


# -- the shell lines --------------------------------------------------------------------------------
MAKE_TARGETS = set(re.findall(r"^([a-z][\w-]*):", (REPO / "Makefile").read_text(encoding="utf-8"), re.M))
PLACEHOLDERS = {"/path/to/rmqtrace", "."}  # the clone, as the README names it
SCRIPTS_THE_README_NAMES = {"consumer.py": "the program under \"Using it\"", "your_consumer.py": "the reader's own"}


def shell_commands(text: str) -> list[tuple[int, list[str]]]:
    """(line, argv) of every command in every ```sh block: continuations joined, comments dropped,
    `a && b` split, leading VAR=value assignments dropped."""
    out: list[tuple[int, list[str]]] = []
    for m in re.finditer(r"^```sh\n(.*?)^```", text, re.S | re.M):
        first = text[:m.start()].count("\n") + 2
        for offset, line in enumerate(m.group(1).replace("\\\n", " ").splitlines()):
            words = shlex.split(line, comments=True)
            while words:
                cut = words.index("&&") if "&&" in words else len(words)
                argv = list(itertools.dropwhile(lambda w: re.match(r"^[A-Z_]+=", w), words[:cut]))
                if argv:
                    out.append((first + offset, argv))
                words = words[cut + 1:]
    return out


def _pip_install(args: list[str]) -> str | None:
    from conftest import pyproject

    from tracer.version import __version__

    extras = set(pyproject()["project"]["optional-dependencies"])
    for arg in (a for a in args if not a.startswith("-")):
        m = re.match(r"^(?P<where>[^\[]+)(\[(?P<extras>[\w,]+)\])?$", arg)
        if m is None:
            return f"not a path with extras: {arg}"
        unknown = set((m["extras"] or "").split(",")) - extras - {""}
        if unknown:
            return f"no such extra {sorted(unknown)} in pyproject.toml"
        where = m["where"]
        wheel = re.search(r"/dist/rmqtrace-([^-]+)-py3-none-any\.whl$", where)
        if wheel:
            if wheel[1] != __version__:
                return f"the wheel `make dist` builds is rmqtrace-{__version__}, not {wheel[1]}"
        elif where not in PLACEHOLDERS:
            return f"pip installs the clone or its wheel, not {where}"
    return None


def check_command(argv: list[str]) -> str | None:
    """None when the command exists as written (as far as it can be checked without running it),
    else why not. A command of a new kind is refused: give it a case here."""
    from tracer.tools.cli import build_parser

    tool = argv[0].removeprefix(".venv/bin/")
    if tool == "cd":
        return None if argv[1:] == ["rmqtrace"] else f"cd into {argv[1:]}"
    if tool == "make":
        unknown = [a for a in argv[1:] if "=" not in a and a not in MAKE_TARGETS]
        return f"no make target {unknown}" if unknown else None
    if tool.endswith(".sh"):
        script = REPO / tool
        if not script.exists():
            return f"no {tool}"
        sub = argv[1] if len(argv) > 1 else ""
        if not re.search(rf"^\s*(\w[\w|-]*\|)?{re.escape(sub)}(\|[\w|-]+)?\)", script.read_text(), re.M):
            return f"{tool} has no subcommand {sub!r}"
        return None
    if tool == "pip":
        return _pip_install(argv[2:]) if argv[1:2] == ["install"] else f"pip {argv[1:2]}"
    if tool == "python":
        script = argv[1]
        return None if script in SCRIPTS_THE_README_NAMES or (REPO / script).exists() else f"no {script}"
    if tool == "rmqtrace":
        try:
            build_parser().parse_args(argv[1:])
        except SystemExit:
            return f"rmqtrace refuses {argv[1:]}"
        return None
    if tool == "opentelemetry-instrument":
        return check_command(argv[1:])
    return f"a command of a kind this test does not know: {argv}"


SHELL = shell_commands(README.read_text(encoding="utf-8"))


def test_the_readme_has_shell_lines_for_every_step_of_the_quick_start() -> None:
    text = README.read_text(encoding="utf-8")
    first_screen = text[:text.index("\n## ", text.index("## Quick start"))].count("\n")
    quick = [argv for line, argv in SHELL if line < first_screen]
    tools = [argv[0].removeprefix(".venv/bin/") + (f" {argv[1]}" if argv[0].endswith(("make", ".sh")) else "")
             for argv in quick]
    assert tools == ["cd", "make demo", "make stack", "services/rocketmq/rmq.sh topic", "services/rocketmq/rmq.sh group",
                     "pip", "python", "rmqtrace", "make alerts-demo"], tools


@pytest.mark.parametrize(("line", "argv"), SHELL, ids=[f"README.md:{line}:{argv[0]}" for line, argv in SHELL])
def test_every_shell_line_of_the_readme_is_a_command_that_exists(line: int, argv: list[str]) -> None:
    assert check_command(argv) is None, f"README.md line {line}: {shlex.join(argv)}: {check_command(argv)}"


@pytest.mark.parametrize("argv", [["make", "stak"], ["services/rocketmq/rmq.sh", "topics", "jobs"],
                                  ["pip", "install", "-e", ".[rocketmqq]"], ["rmqtrace", "report", "--jaegre", "x"],
                                  ["python", "examples/nope.py"], ["docker", "compose", "up"]])
def test_a_shell_line_that_does_not_exist_is_named(argv: list[str]) -> None:
    assert check_command(argv)


@pytest.mark.integration
def test_the_quick_start_gets_a_newcomer_to_a_trace(tmp_path: Path) -> None:
    """The first screen's path, on the real broker and Jaeger: the "Using it" program, as written but
    for fresh topic/group names and its own service name (a shared Jaeger holds other runs' traces
    of service rmqtrace), sends its spans over OTLP; `rmqtrace report --jaeger` reads its message back."""
    import json
    import urllib.request
    import uuid

    from rmq_real import ensure_broker, fresh_group, fresh_topic

    ensure_broker()
    query = f"http://127.0.0.1:{os.environ.get('JAEGER_QUERY_PORT', '16686')}"
    try:
        urllib.request.urlopen(f"{query}/api/services", timeout=5).close()
    except OSError as exc:
        from conftest import unavailable

        unavailable(f"Jaeger not running at {query} ({exc}): make services-up")
    (program,) = [code for _, code in BROKER if "ConsumeLoop(consumer, handle" in code]
    topic, group = fresh_topic("quick"), fresh_group("quick")
    service = f"rmqtrace-quick-{uuid.uuid4().hex[:8]}"
    script = tmp_path / "consumer.py"
    script.write_text(program.replace('"jobs"', f'"{topic}"').replace('"workers"', f'"{group}"'), encoding="utf-8")
    env = {k: v for k, v in _env(tmp_path).items() if k != "OTEL_TRACES_EXPORTER"}
    otlp = f"http://127.0.0.1:{os.environ.get('JAEGER_OTLP_HTTP_PORT', '4318')}"
    env.update(OTEL_SERVICE_NAME=service, OTEL_EXPORTER_OTLP_ENDPOINT=otlp)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=TIMEOUT, cwd=tmp_path,
                          env=env, check=False)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]

    def report() -> dict[str, object]:
        out = subprocess.run([sys.executable, "-m", "tracer", "report", "--jaeger", query, "--service", service, "--json"],
                             capture_output=True, text=True, timeout=120, env=env, check=False)
        return json.loads(out.stdout) if out.returncode == 0 else {"error": out.stderr}

    from waiting import wait_until

    seen: dict[str, object] = {}

    def found() -> bool:  # Jaeger indexes what it received within a second or two
        seen.update(report())
        return seen.get("messages") == 1

    wait_until(found, timeout=60, interval=1.0, what=f"the program's message in Jaeger as {service}: {seen}")
    (grp,) = seen["groups"]  # type: ignore[misc]
    assert grp["group"] == group and grp["stages"]["consumer_wait"]["count"] == 1, grp


def test_the_readme_stays_a_front_page() -> None:
    """Issue 33, item 9: the README had grown to 771 lines of reference. The quick start fits the
    first screen (40 lines), and the reference lives in docs/, linked from "Where to read more"."""
    text = README.read_text(encoding="utf-8")
    lines = text.splitlines()
    start = lines.index("## Quick start")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("## "))
    assert start < 10 and end <= 40, (start, end)
    assert len(lines) <= 400, f"README.md has {len(lines)} lines: move reference to docs/"
    more = text.split("## Where to read more")[1]
    linked = set(re.findall(r"\]\((docs/[\w-]+\.md)\)", more))
    assert linked == {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")}, "every docs/ page is linked"
