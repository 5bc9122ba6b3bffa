"""The export child's review (issue #35 item 2; tests/review35/README.md): the reviewer's scripts,
each exiting 0 once its finding is fixed, and a test of each fix at its root, as a class.

Every test that runs a child ends with the books of tests/test_export_child.py: every span ended is
accepted or dropped, every accepted one exported, failed or lost, every loss in the drop counter.
"""

from __future__ import annotations

import enum
import marshal
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from export_child_helpers import OtlpReceiver
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, Status, StatusCode, TraceFlags
from review_scripts import run_finding, scripts
from test_export_child import Rig
from waiting import wait_until

from tracer.telemetry.exportchild import ChildExportProcessor
from tracer.telemetry.spanwire import plain, span_from_record, span_record

SCRIPTS = scripts("review35")


def test_the_scripts_are_found() -> None:
    assert len(SCRIPTS) >= 7


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_the_finding_stays_fixed(script: Path) -> None:
    run_finding(script, timeout=180)


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    yield r
    r.close()


# -- 01: values of subclasses of the wire types, wherever a record carries a user's value ------------
class Code(enum.IntEnum):
    OK = 7


class Role(str, enum.Enum):
    CONSUMER = "consumer"


class Seconds(float):
    pass


class Blob(bytes):
    pass


class Key(str):
    pass


KINDS: dict[str, Any] = {"int-enum": Code.OK, "str-enum": Role.CONSUMER, "float-subclass": Seconds(0.25),
                         "bytes-subclass": Blob(b"\x00\xff"), "tuple-of-enums": (Code.OK, Code.OK),
                         "mapping-of-enums": {"k": Role.CONSUMER, "n": {"deep": Code.OK}}}


def _attr(v: Any) -> dict[str, Any]:
    return {"v": v}


def _one_span(place: str, value: Any) -> ReadableSpan:
    """A finished span carrying ``value`` at ``place`` (the in-memory exporter's copy: what any exporter gets)."""
    resource = Resource({"service.name": "r", "v": value} if place == "resource" else {"service.name": "r"})
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("scope", "1", attributes=_attr(value) if place == "scope" else None)
    links = [Link(SpanContext(0xA, 0xB, True, TraceFlags(1)), _attr(value))] if place == "link" else []
    span = tracer.start_span(value if place == "name" and isinstance(value, str) else "s", links=links,
                             attributes=_attr(value) if place == "attribute" else None)
    if place == "event":
        span.add_event("e", _attr(value))
    if place == "attribute":
        span.set_attribute("second", value)
    span.end()
    return exporter.get_finished_spans()[0]


PLACES = ["attribute", "event", "link", "resource", "scope", "name"]


@pytest.mark.parametrize(("place", "kind"), [(p, k) for p in PLACES for k in KINDS
                                             if p != "name" or isinstance(KINDS[k], str)])  # a span name is a str
def test_a_value_of_a_wire_type_subclass_is_sent_as_the_encoder_sends_it(place: str, kind: str) -> None:
    value = KINDS[kind]
    span = _one_span(place, value)
    scope = span.instrumentation_scope
    assert scope is not None
    resources = [(dict(span.resource.attributes), span.resource.schema_url)]
    scopes = [(scope.name, scope.version, scope.schema_url, dict(scope.attributes or {}))]
    wire = marshal.loads(marshal.dumps(plain((resources, scopes, span_record(span, 0, 0)))))
    rebuilt = span_from_record(wire[2], [Resource(*wire[0][0])], [InstrumentationScope(*wire[1][0])])
    assert encode_spans([rebuilt]).SerializeToString() == encode_spans([span]).SerializeToString()


def test_plain_leaves_a_record_of_wire_types_as_it_is() -> None:
    record = ("s", 1, 2.5, True, None, b"x", ("a", 1), {"k": ("v",)})
    assert plain(record) == record
    assert all(type(a) is type(b) for a, b in zip(plain(record), record))


def _replayed(span: ReadableSpan) -> ReadableSpan:
    return span_from_record(span_record(span, 0, 0), [span.resource], [span.instrumentation_scope])  # type: ignore[list-item]


def test_a_span_that_cannot_be_sent_fails_alone_not_its_batch(receiver: OtlpReceiver, tmp_path: Path) -> None:
    rig = Rig(receiver, tmp_path, max_batch_size=64, interval_s=0.05)
    good = _one_span("attribute", "fine")
    junk = ReadableSpan(name="junk", context=good.context, resource=good.resource,
                        attributes={"v": object()},  # type: ignore[dict-item]
                        instrumentation_scope=good.instrumentation_scope)
    for i in range(9):  # on_end directly: the SDK itself would have made the object a str
        rig.processor.on_end(_one_span("attribute", i))
    rig.processor.on_end(junk)
    rig.provider.shutdown()
    st = rig.processor.statistics()
    assert (st.accepted, st.exported, st.failed, st.lost) == (10, 9, 1, 0), st
    assert rig.drops.dropped == 1


# -- 02: the dropped counts of events and links -----------------------------------------------------
def test_events_and_links_keep_their_dropped_attribute_counts() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=SpanLimits(max_event_attributes=1, max_link_attributes=1))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    span = provider.get_tracer("t").start_span(
        "s", links=[Link(SpanContext(0xA, 0xB, True, TraceFlags(1)), {"a": 1, "b": 2, "c": 3})])
    span.add_event("e", {"a": 1, "b": 2})
    span.record_exception(ValueError("boom"))
    span.set_status(Status(StatusCode.ERROR, "x"))
    span.end()
    original = exporter.get_finished_spans()[0]
    rebuilt = _replayed(original)
    assert [e.dropped_attributes for e in rebuilt.events] == [e.dropped_attributes for e in original.events] == [1, 3]
    assert [lk.dropped_attributes for lk in rebuilt.links] == [2]
    assert encode_spans([rebuilt]).SerializeToString() == encode_spans([original]).SerializeToString()


# -- 03: the child's stdout is the parent's; acknowledgements have a pipe of their own ------------------
def test_what_the_child_prints_goes_to_the_parents_stdout_and_the_books_hold(
        receiver: OtlpReceiver, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    rig = Rig(receiver, tmp_path, max_batch_size=4, interval_s=0.05)
    rig.processor._spec = rig.processor._spec.replace("gated_otlp", "printing_otlp")
    rig.end(10)
    rig.provider.shutdown()
    out = capfd.readouterr().out
    assert out.count("printed by print") >= 3 and out.count("written to fd 1 ") >= 3, out[-500:]
    st = rig.processor.statistics()
    assert st.exported == 10 and st.lost == 0, st
    rig.check_accounts()


# -- 04: signals meant for the parent's process group --------------------------------------------------
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=lambda s: signal.Signals(s).name)
def test_a_clean_shutdown_after_a_group_signal_flushes(receiver: OtlpReceiver, tmp_path: Path, signum: int) -> None:
    rig = Rig(receiver, tmp_path, gate_open=False, max_batch_size=4, interval_s=0.01)
    rig.end(20)
    wait_until(lambda: rig.processor.statistics().unacknowledged == 20, what="20 spans written to the child")
    pid = rig.processor.child_pid
    assert pid is not None
    # past the interpreter's own start-up (a few ms no launcher can cover): the signals ignored
    wait_until(lambda: _ignores(pid, signal.SIGINT) and _ignores(pid, signal.SIGTERM), what="the child started")
    os.kill(pid, signum)  # what a terminal's Ctrl-C or systemd's stop sends every process of the group
    assert os.getpgid(pid) != os.getpgid(0)  # and a Ctrl-C does not even reach it: a session of its own
    rig.gate.touch()
    rig.provider.shutdown()
    st = rig.processor.statistics()
    assert st.exported == 20 and st.lost == 0 and rig.processor.child_pid is None, st
    rig.check_accounts()


def _ignores(pid: int, signum: int) -> bool:
    """Whether process ``pid`` ignores ``signum`` (Linux: the SigIgn mask of /proc/<pid>/status)."""
    with open(f"/proc/{pid}/status") as f:
        mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigIgn:"))
    return bool(mask >> (signum - 1) & 1)


# -- 06: a child that stops answering is replaced ---------------------------------------------------
def test_a_stopped_child_is_killed_counted_and_replaced(receiver: OtlpReceiver, tmp_path: Path) -> None:
    rig = Rig(receiver, tmp_path, max_queue_size=64, max_batch_size=8, interval_s=0.01, restart_delay_s=0,
              stall_timeout_s=1.0)
    rig.end(8)
    assert rig.processor.force_flush(30_000)
    stopped = rig.processor.child_pid
    assert stopped is not None
    os.kill(stopped, signal.SIGSTOP)
    try:
        rig.end(2000)  # far beyond the pipe: the writer is in its write when the stall is seen
        wait_until(lambda: rig.processor.statistics().restarts == 1, what="the stopped child replaced")
    finally:
        try:
            os.kill(stopped, signal.SIGKILL)
        except ProcessLookupError:
            pass
    rig.end(8)
    assert rig.processor.force_flush(30_000)
    st = rig.processor.statistics()
    assert st.lost > 0 and st.exported >= 16 and rig.processor.child_pid not in (None, stopped), st
    rig.provider.shutdown()
    rig.check_accounts()


@pytest.mark.parametrize(("env", "expected"), [({}, 30.0), ({"OTEL_EXPORTER_OTLP_TIMEOUT": "1"}, 10.0),
                                               ({"OTEL_EXPORTER_OTLP_TIMEOUT": "20"}, 60.0),
                                               ({"OTEL_EXPORTER_OTLP_TIMEOUT": "20",
                                                 "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "5"}, 15.0),
                                               ({"OTEL_EXPORTER_OTLP_TIMEOUT": "junk"}, 30.0)])
def test_the_stall_timeout_follows_the_exporters_timeout(env: dict[str, str], expected: float) -> None:
    proc = ChildExportProcessor(env=env)
    try:
        assert proc.stall_timeout_s == expected
    finally:
        proc.shutdown()


def test_a_hung_child_does_not_hold_the_writer_past_a_flush(receiver: OtlpReceiver, tmp_path: Path) -> None:
    # the gate never opens: a live child that reads nothing; the stall kills it, the next one exports
    rig = Rig(receiver, tmp_path, gate_open=False, max_queue_size=256, max_batch_size=16, interval_s=0.01,
              restart_delay_s=0, stall_timeout_s=1.0)
    rig.end(500)
    wait_until(lambda: rig.processor.statistics().restarts >= 1, what="the hung child replaced")
    rig.gate.touch()
    rig.end(5)
    assert rig.processor.force_flush(30_000)
    rig.provider.shutdown()
    st = rig.processor.statistics()
    assert st.lost > 0 and st.exported >= 5, st
    rig.check_accounts()


def test_a_span_without_a_context_is_ignored_as_the_in_process_path_ignores_it(
        receiver: OtlpReceiver, tmp_path: Path) -> None:
    from tracer.config import CountingSpanProcessor, DropCounter

    bare = ReadableSpan(name="no context")  # what a hand-made span may be; the SDK's always have one
    CountingSpanProcessor(InMemorySpanExporter(), DropCounter()).on_end(bare)  # the sibling: ignored
    rig = Rig(receiver, tmp_path)
    rig.processor.on_end(bare)
    rig.provider.shutdown()
    st = rig.processor.statistics()
    assert (st.accepted, st.dropped) == (0, 0), st


@pytest.mark.parametrize(("env", "expected"), [
    ({}, (2048, 512, 0.2)),
    ({"OTEL_BSP_SCHEDULE_DELAY": "50", "OTEL_BSP_MAX_QUEUE_SIZE": "100", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "4096"},
     (100, 100, 0.05)),
    ({"OTEL_BSP_SCHEDULE_DELAY": "5000", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "64"}, (2048, 64, 5.0)),
    ({"OTEL_BSP_SCHEDULE_DELAY": "0"}, (2048, 512, 0.2)), ({"OTEL_BSP_SCHEDULE_DELAY": "junk"}, (2048, 512, 0.2)),
])
def test_the_otel_bsp_settings_reach_the_child_path_as_the_in_process_one_reads_them(
        monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: tuple[int, int, float]) -> None:
    from tracer.config import Settings, configure_tracing

    for name in ("OTEL_BSP_SCHEDULE_DELAY", "OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    provider = configure_tracing(Settings(export_child=True, traces_exporter="console"), set_global=False)
    assert provider is not None
    try:
        (proc,) = provider._active_span_processor._span_processors  # noqa: SLF001 - what was built
        assert isinstance(proc, ChildExportProcessor)
        assert (proc.max_queue_size, proc.max_batch_size, proc.interval_s) == expected
    finally:
        provider.shutdown()


def test_a_drops_hook_that_raises_costs_only_its_own_count(receiver: OtlpReceiver, tmp_path: Path) -> None:
    calls: list[int] = []

    def broken(n: int) -> None:
        calls.append(n)
        raise RuntimeError("the counter is broken")

    rig = Rig(receiver, tmp_path, gate_open=False, max_queue_size=4, max_batch_size=2, interval_s=0.01,
              restart_delay_s=0)
    rig.processor._drops = broken  # after construction: the plain callable check is not what is tested
    rig.end(200)  # the queue overflows: every refusal calls the hook from the span's end, which must not raise
    wait_until(lambda: rig.processor.statistics().unacknowledged > 0, what="spans written to the child")
    pid = rig.processor.child_pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # its unacknowledged spans: the writer calls the hook
    wait_until(lambda: rig.processor.statistics().lost > 0, what="the dead child's spans counted")
    rig.gate.touch()
    rig.end(3)
    assert rig.processor.force_flush(30_000)  # the writer lives on
    rig.provider.shutdown()
    st = rig.processor.statistics()
    assert st.accepted + st.dropped == len(rig.ended) and st.accepted == st.exported + st.failed + st.lost, st
    assert sum(calls) == st.dropped + st.failed + st.lost and st.exported >= 3, (sum(calls), st)


@pytest.mark.parametrize("handlers", [True, False], ids=["os.fork", "a fork without handlers"])
def test_a_process_forked_while_a_child_starts_does_not_wedge_the_writer(
        receiver: OtlpReceiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, handlers: bool) -> None:
    """A worker forked (another thread's os.fork) while the writer starts a child holds every
    descriptor the parent has then, the acknowledgement pipe's write end too: its fork handler
    closes it; without handlers (a C extension's fork) the dead child's reader is not waited for."""
    import time

    from tracer.telemetry import exportchild

    holders: list[int] = []
    real = subprocess.Popen

    def popen(*args: Any, **kw: Any) -> Any:
        proc = real(*args, **kw)
        if not holders:
            # a raw fork runs no fork handler; os.fork runs them (ours closes the starting pipe)
            pid = os.fork() if handlers else _raw_fork()
            if pid == 0:
                time.sleep(120)  # real-time: the holder only keeps its descriptors open; killed below
                os._exit(0)
            holders.append(pid)
        return proc

    monkeypatch.setattr(exportchild.subprocess, "Popen", popen)
    try:
        rig = Rig(receiver, tmp_path, gate_open=False, max_batch_size=4, interval_s=0.01, restart_delay_s=0)
        rig.end(8)
        wait_until(lambda: rig.processor.statistics().unacknowledged == 8, what="8 spans written to the child")
        pid = rig.processor.child_pid
        assert pid is not None and holders
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: rig.processor.statistics().lost == 8, what="the dead child reaped", timeout=30)
        rig.gate.touch()
        rig.end(4)
        assert rig.processor.force_flush(30_000)
        rig.provider.shutdown()
        st = rig.processor.statistics()
        assert (st.exported, st.lost) == (4, 8), st
        rig.check_accounts()
    finally:
        for holder in holders:
            os.kill(holder, signal.SIGKILL)
            os.waitpid(holder, 0)


def _raw_fork() -> int:
    """fork(2) without Python's fork handlers (what a C extension's fork does)."""
    import ctypes

    return int(ctypes.CDLL(None, use_errno=True).fork())
