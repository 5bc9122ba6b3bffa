"""The cost table / longest-first review (tests/review34/README.md): its scripts, each exiting 0 once
its finding is fixed, and one test per fixed class that finds every member of the class.

The review of issue 34 (2026-12-05) attacked the cost table, ``send_job`` and ``report --costs``
through the public API and the docs; a script here failing says which promise broke in the
reviewer's words."""

from __future__ import annotations

import json
import math
import numbers
import os
import socket
import sys
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from review_scripts import run_finding, scripts

from tracer.clients.legacy import TracedLegacyProducer
from tracer.clients.producer import JobSendError, TracedProducer
from tracer.dispatch import Dispatcher
from tracer.dispatch.cost import job_costs, message_key, table_cost
from tracer.dispatch.costtable import (
    MAX_BYTES,
    MAX_COST_S,
    CostTable,
    CostTableError,
    as_seconds,
    check_cost,
    learn_costs,
    load_costs,
    parse_costs,
)
from tracer.embedded import EmbeddedBroker, Message, Producer
from tracer.path.message import key_tuple
from tracer.report.cli import cmd_report
from tracer.telemetry.tracer import MessageTracer

HERE = Path(__file__).parent / "review34"
SCRIPTS = scripts("review34")


def test_the_scripts_are_found() -> None:
    assert len(SCRIPTS) == 18


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_the_finding_stays_fixed(script: Path) -> None:
    run_finding(script)


# -- every file kind load_costs may be handed: a regular file or one clear refusal, never a hang --
def _fifo(tmp: Path) -> Path:
    os.mkfifo(tmp / "fifo")
    return tmp / "fifo"


def _socket(tmp: Path) -> Path:
    path = tmp / "sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))  # left bound: the test process ends it
    return path


NOT_FILES: dict[str, Callable[[Path], Path]] = {
    "a FIFO": _fifo, "a directory": lambda tmp: tmp, "a character device": lambda tmp: Path("/dev/null"),
    "a socket": _socket,
}


@pytest.mark.parametrize("kind", NOT_FILES)
def test_load_costs_refuses_what_is_not_a_regular_file(kind: str, tmp_path: Path) -> None:
    path = NOT_FILES[kind](tmp_path)
    with pytest.raises(CostTableError, match=f"not a regular file \\({kind}\\)"):
        load_costs(path)
    link = tmp_path / "link.json"
    link.symlink_to(path)
    with pytest.raises(CostTableError, match=f"not a regular file \\({kind}\\)"):
        load_costs(link)


@pytest.mark.parametrize("path", [0, 1, True, 2.5, None, b"costs.json", [b"x"]], ids=repr)
def test_load_costs_takes_no_file_descriptor_nor_junk_for_a_path(path: Any) -> None:
    before = os.fstat(1)
    with pytest.raises(TypeError, match="path must be a str or os.PathLike"):
        load_costs(path)
    assert os.fstat(1) == before  # stdout is still open


# -- what save() writes, load_costs reads: every table, every target -----------------------
@given(st.integers(-2, 2), st.sampled_from(["k", "é", "\U0001f600"]))
@settings(max_examples=15, deadline=None)
def test_a_table_is_saved_only_when_it_loads_back(step: int, char: str) -> None:
    """Around the size bound, with keys that JSON escapes (6 or 12 bytes a character): save refuses
    exactly the tables load_costs would refuse, and writes nothing then."""
    import tempfile
    per_key = len(json.dumps("000000" + char * 194)) + len(": 1.0,\n")
    n = MAX_BYTES // per_key + step * 40
    table = learn_costs((f"{i:06d}" + char * 194, 1.0) for i in range(n))
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "costs.json"
        try:
            table.save(path)
        except CostTableError as exc:
            assert "more than the" in str(exc) and not path.exists()
            assert len(json.dumps(table.as_dict(), indent=0)) + 1 > MAX_BYTES
            return
        assert load_costs(path).costs == table.costs


def test_save_writes_through_a_link_and_to_what_is_not_a_file(tmp_path: Path) -> None:
    table = CostTable({"a": 1.0})
    real = tmp_path / "shared" / "costs.json"
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "costs.json"
    link.symlink_to(real)
    table.save(link)
    assert link.is_symlink() and load_costs(real) == table
    dangling = tmp_path / "new.json"
    dangling.symlink_to(tmp_path / "made.json")
    table.save(dangling)
    assert dangling.is_symlink() and load_costs(tmp_path / "made.json") == table
    table.save("/dev/null")  # a device is written to, never replaced
    assert Path("/dev/null").is_char_device()


@pytest.mark.parametrize(("umask", "existing", "mode"), [(0o022, None, 0o644), (0o077, None, 0o600),
                                                          (0o022, 0o640, 0o640), (0o077, 0o644, 0o644)])
def test_save_gives_the_mode_any_write_would(umask: int, existing: int | None, mode: int, tmp_path: Path) -> None:
    """The producer reading the table may run as another user: the atomic save's temp file must not
    leave its private 0600 on the table."""
    path = tmp_path / "costs.json"
    if existing is not None:
        path.write_text("{}")
        path.chmod(existing)
    old = os.umask(umask)
    try:
        CostTable({"a": 1.0}).save(path)
    finally:
        os.umask(old)
    assert oct(path.stat().st_mode & 0o777) == oct(mode)
    assert [p.name for p in tmp_path.iterdir()] == ["costs.json"]  # no temp file left


def test_a_table_cannot_be_changed_behind_its_checks() -> None:
    table = CostTable({"a": 1.0, "b": 3.0})
    with pytest.raises(TypeError):
        table.costs["z"] = -5.0  # type: ignore[index]
    assert table == CostTable({"a": 1.0, "b": 3.0}) and table.default == 2.0
    with pytest.raises(TypeError, match="mapping"):
        CostTable([("a", 1.0)])  # type: ignore[arg-type]
    import copy
    import pickle
    for again in (pickle.loads(pickle.dumps(table)), copy.deepcopy(table), copy.copy(table)):
        assert again == table and again.default == 2.0  # still handed to a pool's worker, copied


@pytest.mark.parametrize("text", [
    '{"format":"rmqtrace.costs","version":1,"costs":{"a":1,"a":2}}',
    '{"format":"rmqtrace.costs","format":"rmqtrace.costs","version":1,"costs":{}}',
    '{"format":"rmqtrace.costs","version":1,"costs":{},"extra":{"x":1,"x":1}}',
])
def test_a_key_twice_anywhere_is_refused(text: str) -> None:
    with pytest.raises(CostTableError, match="^costs: duplicate key"):
        parse_costs(text)


# -- one rule of what a cost is: the dispatcher's hint and the table's entry -----------------
class _Real:
    """A user's numbers.Real whose conversion raises."""

    def __float__(self) -> float:
        raise ArithmeticError("no")


numbers.Real.register(_Real)

VALUES: list[Any] = [0, 0.0, 1, 2.5, Fraction(1, 2), Fraction(10**400, 3), 10**400, 10**5000, -1, -10**400,
                     math.nan, math.inf, -0.0, 1e300, True, False, "1", None, [1], _Real()]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_one_cost_rule_for_the_dispatcher_and_the_table(value: Any) -> None:
    """What the dispatcher takes as a cost (a hint, else 0 counted) is what a table takes, up to
    the table's bound; a refusal is always the CostTableError, never another exception."""
    seen: list[Any] = []
    with Dispatcher(seen.append, workers=1, cost=lambda _m: value) as d:
        d.submit("m")
    dispatcher_took = d.statistics().cost_errors == 0
    expected = as_seconds(value)
    assert dispatcher_took == (expected is not None)
    try:
        taken: float | None = check_cost(value, "x")
    except CostTableError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 200
        taken = None
    assert taken == (expected if expected is not None and expected < MAX_COST_S else None)


# -- key=: one rule for the dispatcher and the table ----------------------------------------
@pytest.mark.parametrize("junk", [b"a", 7, frozenset({"a"}), ("a",), 1.5])
def test_a_junk_key_is_loud_wherever_a_table_is_read(junk: Any) -> None:
    table = CostTable({"a": 9.0, "b": 1.0, "c": 2.0})
    with pytest.raises(CostTableError, match="^key= returned .* not a str or None \\(for message 0\\)"):
        job_costs(["m"], table, key=lambda _m: junk)
    with pytest.raises(CostTableError, match="^key= returned"):
        table_cost(table, key=lambda _m: junk)("m")  # cost_aware: counted as a cost error, cost 0


def test_a_raising_key_or_group_is_named_as_itself() -> None:
    table = CostTable({"a": 9.0}, group=lambda k: k[0] if k != "x" else {}["boom"])
    with pytest.raises(CostTableError, match="^key= raised ZeroDivisionError"):
        job_costs(["m"], table, key=lambda _m: 1 / 0)
    with pytest.raises(CostTableError, match="^group= raised KeyError for key 'x'"):
        job_costs(["m"], table, key=lambda _m: "x")


def test_a_long_key_is_read_as_its_span_recorded_it() -> None:
    from tracer.dispatch.costtable import MAX_KEY_CHARS
    from tracer.telemetry.attributes import MAX_ATTR_CHARS, cap
    assert MAX_KEY_CHARS == MAX_ATTR_CHARS  # one cap: what a span records is what a table holds
    long_key = "suite-" + "x" * 400
    table = CostTable({cap(long_key): 4.0, "b": 0.1, "c": 0.1})
    assert table.cost(long_key) == 4.0 and job_costs([long_key], table, key=str) == [4.0]


@given(st.one_of(st.text(min_size=1, max_size=6),
                 st.frozensets(st.text(min_size=1, max_size=6), min_size=1, max_size=8),
                 st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=8)))
def test_the_recorded_first_key_is_the_producers_key(keys: Any) -> None:
    """What the consumer records first (and ``report --costs`` learns) is what the producer's
    message_key reads, whatever the container and its order."""
    m = type("M", (), {"keys": keys if not isinstance(keys, frozenset) else set(keys)})()
    assert (key_tuple(m.keys)[0] or None) == message_key(m)


# -- every send_job: a failure halfway says what went; a junk job id sends nothing -----------
class _LegacyMessage:
    def __init__(self, key: str) -> None:
        self.topic, self.keys, self.props = "T", key, {}

    def set_property(self, key: str, value: str) -> None:
        self.props[key] = value


class _LegacyProducer:
    def __init__(self, fail_at: int) -> None:
        self.calls, self.fail_at = 0, fail_at

    def send_sync(self, msg: Any) -> Any:
        self.calls += 1
        if self.calls == self.fail_at:
            raise ConnectionError("down")
        return type("R", (), {"msg_id": f"M{self.calls}"})()


class _Producer5:
    def __init__(self, fail_at: int) -> None:
        broker = EmbeddedBroker()
        broker.create_topic("T")
        self.real, self.calls, self.fail_at = Producer(broker, ["T"]), 0, fail_at
        self.real.startup()

    def send(self, msg: Any) -> Any:
        self.calls += 1
        if self.calls == self.fail_at:
            raise ConnectionError("down")
        return self.real.send(msg)


def _message5(key: str) -> Message:
    m = Message()
    m.topic, m.body, m.keys = "T", b"x", key
    return m


PRODUCERS: dict[str, tuple[Callable[[int], Any], Callable[[str], Any]]] = {
    "5.x": (lambda n: TracedProducer(_Producer5(n), MessageTracer()), _message5),
    "2.x": (lambda n: TracedLegacyProducer(_LegacyProducer(n), MessageTracer()), _LegacyMessage),
}


@pytest.mark.parametrize("client", PRODUCERS)
@pytest.mark.parametrize("fail_at", [1, 2, 4])
def test_every_send_job_says_what_was_sent_when_a_send_fails(client: str, fail_at: int) -> None:
    make_producer, make_message = PRODUCERS[client]
    msgs = [make_message(f"k{i}") for i in range(4)]
    with pytest.raises(JobSendError) as err:
        make_producer(fail_at).send_job(msgs, cost=lambda m: float((message_key(m) or m.keys)[-1]), job_id="j")
    order = msgs[::-1]  # longest first
    e = err.value
    assert [m for m, _ in e.sent] == order[:fail_at - 1] and all(r is not None for _, r in e.sent)
    assert e.failed is order[fail_at - 1] and e.unsent == order[fail_at:]
    assert isinstance(e.__cause__, ConnectionError) and "\n" not in str(e)


@pytest.mark.parametrize("client", PRODUCERS)
@pytest.mark.parametrize(("job_id", "error"), [(5, TypeError), (b"j", TypeError), ("", ValueError), (" ", ValueError)])
def test_every_send_job_refuses_a_job_id_it_cannot_carry(client: str, job_id: Any, error: type) -> None:
    make_producer, make_message = PRODUCERS[client]
    producer = make_producer(0)
    with pytest.raises(error, match="job_id"):
        producer.send_job([make_message("a")], cost=lambda _m: 1.0, job_id=job_id)
    assert producer.wrapped.calls == 0


# -- report: every output refuses the input and each other; nothing learned, nothing written --
def _spans(path: Path) -> Path:
    sys.path.insert(0, str(HERE))
    from _spans import span, write  # the reviewer's span writer
    write(path, [span(0, ["a"], 1.0), span(1, ["b"], 0.1)])
    return path


def _report(*argv: str) -> int:
    from tracer.tools.cli import build_parser
    args = build_parser().parse_args(["report", *argv])
    return cmd_report(args)


@pytest.mark.parametrize("flag", ["--costs", "--html", "--png"])
def test_every_output_refuses_the_spans_file_it_reads(flag: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    spans = _spans(tmp_path / "s.jsonl")
    before = spans.read_bytes()
    (tmp_path / "alias.jsonl").symlink_to(spans)
    for target in (spans, tmp_path / "alias.jsonl"):
        assert _report(str(spans), flag, str(target), "--json") == 2
        assert spans.read_bytes() == before
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "is the spans file read" in err[0]


def test_two_outputs_naming_one_file_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spans = _spans(tmp_path / "s.jsonl")
    assert _report(str(spans), "--html", str(tmp_path / "o"), "--costs", str(tmp_path / "o"), "--json") == 2
    assert "is --html's file" in capsys.readouterr().err


def test_nothing_learned_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sys.path.insert(0, str(HERE))
    from _spans import span, write
    write(tmp_path / "s.jsonl", [span(0, None, 1.0), span(1, ["k" * 300], 0.1)])
    assert _report(str(tmp_path / "s.jsonl"), "--costs", str(tmp_path / "c.json"), "--json") == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("no handled message with a usable message key to learn from (2 without one); "
                            "nothing written") and not (tmp_path / "c.json").exists()


def _actions(parser: Any) -> list[tuple[str, Any]]:
    import argparse
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += [(f"{name} {n}", a) for n, a in _actions(sub)]
        else:
            out.append((action.dest, action))
    return out


def test_every_path_argument_refuses_an_empty_path() -> None:
    """An unset shell variable (--costs "$OUT") is "": taken as "not asked" it wrote nothing, exit
    0; as a folder, the current one. Every argument naming a file or folder, of every command."""
    from tracer.argtypes import path
    from tracer.tools.cli import build_parser
    named = [(where, a) for where, a in _actions(build_parser())
             if str(a.metavar or "").upper() in {"FILE", "DIR", "SPANS.JSONL"}]
    assert len(named) >= 5
    assert [where for where, a in named if a.type is not path] == []
