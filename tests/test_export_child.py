"""The export child (tracer.telemetry.exportchild): a real child process, a real OTLP/HTTP receiver.

What every test checks at its end, after ``shutdown``: every span ended is either accepted or
dropped (``accepted + dropped == ended``); every accepted span is exported, failed or lost
(``accepted == exported + failed + lost``); every span not exported went to the drop counter; and
the receiver holds exactly the exported spans, each one once.
"""

from __future__ import annotations

# imported before any TracerProvider exists: the SDK's (1.45) fork handler submits to a thread pool,
# and a pool module imported after a provider registers its own fork hooks after the provider's, so
# in a forked worker the provider's handler waits for ever on the lock the pool's before-fork hook holds
import concurrent.futures.thread  # noqa: F401
import logging
import multiprocessing
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from export_child_helpers import OtlpReceiver
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode, TraceFlags, TraceState
from opentelemetry.trace import SpanContext as Ctx
from waiting import wait_until

from tracer.config import DropCounter, Settings, configure_tracing
from tracer.telemetry.exportchild import ChildExportProcessor, ExportPhase, span_from_record, span_record

TESTS = Path(__file__).resolve().parent


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    yield r
    r.close()


class Rig:
    """A provider whose only processor is the child exporter, gated by a file (the child does
    not export, and so stops reading its pipe, while the gate is shut)."""

    def __init__(self, receiver: OtlpReceiver, tmp_path: Path, *, gate_open: bool = True, **kw: Any) -> None:
        self.gate = tmp_path / "gate"
        if gate_open:
            self.gate.touch()
        self.receiver = receiver
        self.drops = DropCounter()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
        self.processor = ChildExportProcessor("export_child_helpers:gated_otlp",
                                              {"gate": str(self.gate), "endpoint": receiver.endpoint,
                                               "owner": os.getpid()},
                                              drops=self.drops, env=env, **kw)
        self.provider = TracerProvider(resource=Resource.create({"service.name": "child-test"}))
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer("t")
        self.ended: list[int] = []

    def end(self, n: int) -> None:
        for i in range(n):
            span = self.tracer.start_span(f"s{len(self.ended)}", attributes={"i": i})
            span.end()
            self.ended.append(span.get_span_context().span_id)

    def check_accounts(self) -> None:
        st = self.processor.statistics()
        assert st.accepted + st.dropped == len(self.ended), st
        assert st.accepted == st.exported + st.failed + st.lost, st
        assert self.drops.dropped == st.dropped + st.failed + st.lost, (self.drops.dropped, st)
        got = self.receiver.span_ids()
        assert len(got) == len(set(got)) == st.exported, (len(got), st)
        assert set(got) <= set(self.ended)


def _rich_span() -> ReadableSpan:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "r", "n": 3}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("scope", "1.2", schema_url="https://opentelemetry.io/schemas/1.26.0")
    parent = Ctx(0xABC, 0xDEF, True, TraceFlags(1), TraceState([("k", "v")]))
    from opentelemetry import trace

    ctx = trace.set_span_in_context(trace.NonRecordingSpan(parent))
    span = tracer.start_span("process t", context=ctx, kind=SpanKind.CONSUMER,
                             attributes={"s": "x", "i": 7, "f": 1.5, "b": True, "keys": ("a", "b")},
                             links=[Link(Ctx(0x1, 0x2, True, TraceFlags(0)), {"l": 1})])
    span.add_event("e", {"ea": "v"}, timestamp=123)
    span.set_status(Status(StatusCode.ERROR, "boom"))
    span.end()
    provider.shutdown()
    return exporter.get_finished_spans()[0]


def test_a_record_rebuilds_the_span_the_otlp_encoder_sees() -> None:
    span = _rich_span()
    rebuilt = span_from_record(span_record(span, 0, 0), [span.resource], [span.instrumentation_scope])  # type: ignore[list-item]
    assert encode_spans([rebuilt]).SerializeToString() == encode_spans([span]).SerializeToString()


def test_shutdown_flushes_every_accepted_span(receiver: OtlpReceiver, tmp_path: Path) -> None:
    rig = Rig(receiver, tmp_path)
    rig.end(700)  # more than one batch, and no flush before shutdown
    rig.provider.shutdown()
    st = rig.processor.statistics()
    assert (st.accepted, st.exported, st.dropped, st.lost) == (700, 700, 0, 0)
    assert sorted(receiver.span_ids()) == sorted(rig.ended)
    assert set(receiver.resources[0].items()) >= {("service.name", "child-test")}
    rig.check_accounts()


def test_a_full_queue_drops_and_counts_and_never_blocks(receiver: OtlpReceiver, tmp_path: Path) -> None:
    # the child is alive and stops reading: its pipe fills, then the queue; on_end keeps returning
    rig = Rig(receiver, tmp_path, gate_open=False, max_queue_size=8, max_batch_size=4, interval_s=0.01)
    rig.end(5000)  # ~1 MB of spans: far more than the pipe (64 KiB) and the queue hold
    st = rig.processor.statistics()
    assert st.dropped > 0 and st.exported == 0
    assert rig.drops.dropped == st.dropped
    rig.gate.touch()
    rig.provider.shutdown()
    rig.check_accounts()
    assert rig.processor.statistics().lost == 0  # everything accepted reached the receiver


def test_shutdown_with_a_child_that_stopped_reading_returns_and_counts_the_rest_lost(
        receiver: OtlpReceiver, tmp_path: Path) -> None:
    # the gate never opens: the pipe fills and the writer blocks in its write; shutdown's
    # timeout stops the child, and everything accepted is lost, every span counted
    rig = Rig(receiver, tmp_path, gate_open=False, max_queue_size=4096, max_batch_size=64, interval_s=0.01)
    rig.end(3000)
    rig.processor.shutdown(timeout_millis=300)
    rig.provider.shutdown()  # the processor's shutdown again: a no-op
    st_ = rig.processor.statistics()
    assert st_.exported == 0 and st_.lost == st_.accepted > 0, st_
    rig.check_accounts()


def test_spans_ended_while_shutdown_runs_are_each_exported_or_counted(receiver: OtlpReceiver, tmp_path: Path) -> None:
    rig = Rig(receiver, tmp_path, max_batch_size=32, interval_s=0.01)
    ended: list[list[int]] = [[] for _ in range(4)]
    go = threading.Event()

    def worker(mine: list[int]) -> None:
        go.wait()
        for i in range(3000):
            span = rig.tracer.start_span(f"w{i}")
            span.end()
            mine.append(span.get_span_context().span_id)

    threads = [threading.Thread(target=worker, args=(e,)) for e in ended]
    for t in threads:
        t.start()
    go.set()
    rig.processor.shutdown()  # while the four threads end spans
    for t in threads:
        t.join()
    rig.ended = [sid for e in ended for sid in e]
    rig.check_accounts()  # accepted + dropped == 12 000; accepted == exported + failed + lost
    assert rig.processor.statistics().lost == 0


def test_a_dead_child_is_restarted_and_its_unacknowledged_spans_counted_lost(
        receiver: OtlpReceiver, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rig = Rig(receiver, tmp_path, gate_open=False, max_batch_size=4, interval_s=0.01, restart_delay_s=0)
    rig.end(20)
    wait_until(lambda: rig.processor.statistics().unacknowledged == 20, what="20 spans written to the child")
    first = rig.processor.child_pid
    assert first is not None
    with caplog.at_level(logging.WARNING, logger="tracer.telemetry.exportchild"):
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: rig.processor.statistics().lost == 20, what="the dead child's spans counted")
    assert rig.drops.dropped == 20
    assert any("died" in r.getMessage() and "20 span(s)" in r.getMessage() for r in caplog.records)
    rig.gate.touch()
    rig.end(10)
    assert rig.processor.force_flush(30_000)
    st = rig.processor.statistics()
    assert st.restarts == 1 and st.exported == 10 and rig.processor.child_pid != first
    assert sorted(receiver.span_ids()) == sorted(rig.ended[20:])
    rig.provider.shutdown()
    rig.check_accounts()


def test_a_child_whose_exports_fail_counts_every_span(tmp_path: Path) -> None:
    receiver = OtlpReceiver(status=400)  # refuses every batch
    try:
        rig = Rig(receiver, tmp_path, max_batch_size=50)
        rig.end(60)
        rig.provider.shutdown()
        st = rig.processor.statistics()
        assert st.failed == 60 and st.exported == 0
        rig.check_accounts()
    finally:
        receiver.close()


def _end_in_forked_worker(rig: Rig, n: int) -> None:
    rig.end(n)
    rig.provider.shutdown()
    st_ = rig.processor.statistics()
    os._exit(0 if (st_.accepted, st_.exported, st_.lost) == (n, n, 0) else 1)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_worker_exports_its_own_spans_and_not_the_parents(receiver: OtlpReceiver, tmp_path: Path) -> None:
    # gunicorn's preload: the provider is set up, spans are ended, then the worker is forked
    rig = Rig(receiver, tmp_path, gate_open=False, interval_s=0.01)
    rig.end(30)  # queued or at the stalled child when the fork happens: the parent's to export
    ctx = multiprocessing.get_context("fork")
    worker = ctx.Process(target=_end_in_forked_worker, args=(rig, 50))
    rig.gate.touch()  # the forked worker's own child exports at once
    worker.start()
    worker.join(120)
    assert worker.exitcode == 0
    rig.provider.shutdown()
    st_ = rig.processor.statistics()  # the parent's books: its own 30, exported once
    assert (st_.accepted, st_.exported, st_.lost, rig.drops.dropped) == (30, 30, 0, 0), st_
    got = receiver.span_ids()
    assert len(got) == len(set(got)) == 80  # the worker's 50 besides, none of the parent's twice
    assert set(rig.ended) <= set(got)


def test_the_setting_puts_the_exporters_in_a_child(receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.endpoint)
    settings = Settings.from_env({"RMQTRACE_EXPORT_CHILD": "true", "OTEL_TRACES_EXPORTER": "otlp",
                                  "OTEL_SERVICE_NAME": "child-setting"})
    assert settings.export_child
    drops = DropCounter()
    provider = configure_tracing(settings, set_global=False, drops=drops)
    assert provider is not None
    processors = provider._active_span_processor._span_processors  # noqa: SLF001 - what was built
    assert [type(p) for p in processors] == [ChildExportProcessor]
    span = provider.get_tracer("t").start_span("one")
    span.end()
    provider.shutdown()
    assert receiver.span_ids() == [span.get_span_context().span_id]
    assert receiver.resources[0]["service.name"] == "child-setting"


def test_the_setting_says_when_a_provider_installed_before_keeps_its_processors(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from opentelemetry import trace

    installed = TracerProvider()
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: installed)
    with caplog.at_level(logging.WARNING, logger="tracer.config"):
        got = configure_tracing(Settings(export_child=True), set_global=False)
    assert got is installed
    assert not installed._active_span_processor._span_processors  # noqa: SLF001 - nothing added
    assert any("RMQTRACE_EXPORT_CHILD" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("value", ["yes", "1", "child"])
def test_the_setting_refuses_what_it_cannot_mean(value: str) -> None:
    with pytest.raises(ValueError, match="RMQTRACE_EXPORT_CHILD"):
        Settings.from_env({"RMQTRACE_EXPORT_CHILD": value})


@pytest.mark.parametrize("kw", [{"max_queue_size": 0}, {"max_batch_size": -1}, {"interval_s": float("nan")},
                                {"interval_s": 0}, {"interval_s": float("inf")}, {"restart_delay_s": -1},
                                {"restart_delay_s": 10**400}, {"max_queue_size": 2.5}, {"factory": "no_colon"},
                                {"drops": 3}, {"factory": "no_such_module_x:f"}, {"factory": "tracer.config:nothing"},
                                {"factory": "tracer.config:EXPORTERS"}, {"factory": ":f"}, {"factory": "tracer.config:"},
                                {"stall_timeout_s": 0}, {"stall_timeout_s": float("nan")}, {"stall_timeout_s": True},
                                {"stall_timeout_s": "5"}])
def test_arguments_that_cannot_work_are_refused(kw: dict[str, Any]) -> None:
    with pytest.raises((ValueError, TypeError)) as info:
        ChildExportProcessor(**kw)
    assert "\n" not in str(info.value)


# -- model: any sequence of ends, stalls, kills and flushes keeps the books ------------------------------------
class ExportChildModel(RuleBasedStateMachine):
    """Spans ended in bursts while the child is stalled (gate shut), stopped (SIGSTOP) or exporting,
    killed at any moment, flushed when it can export, shut down (with time to flush, or none) and
    shut down again. Named invariants after every step; at teardown, after shutdown, the books
    balance exactly and the receiver holds exactly the exported spans."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="rmqtrace-export-model-"))
        self.receiver = OtlpReceiver()
        self.rig = Rig(self.receiver, self.tmp, gate_open=True, max_queue_size=64, max_batch_size=16,
                       interval_s=0.01, restart_delay_s=0)
        self.kills = 0
        self.stopped: int | None = None  # a child SIGSTOPped by the model (the stall kills it only after 30 s)
        self.shut = False
        self.phase = ExportPhase.OPEN  # the furthest statistics().phase seen

    @rule(n=st.integers(1, 120))
    def end_spans(self, n: int) -> None:
        self.rig.end(n)

    @rule()
    def stall(self) -> None:
        self.rig.gate.unlink(missing_ok=True)

    @rule()
    def resume(self) -> None:
        self.rig.gate.touch()

    @rule()
    def kill_child(self) -> None:
        # whether a child runs now is the real process's state, which moves with the machine's load:
        # as a precondition it made hypothesis's draws differ between a run and its replay (flaky)
        pid = self.rig.processor.child_pid
        if pid is None:
            return
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:  # it died (and was reaped) since: nothing to kill
            return
        self.kills += 1
        if pid == self.stopped:
            self.stopped = None  # dead: nothing to continue
        wait_until(lambda: self.rig.processor.child_pid != pid, what="the dead child reaped")

    @precondition(lambda self: self.stopped is None)
    @rule()
    def stop_child(self) -> None:
        pid = self.rig.processor.child_pid
        if pid is None:
            return
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            return
        self.stopped = pid

    @precondition(lambda self: self.stopped is not None)
    @rule()
    def continue_child(self) -> None:
        self._continue()

    def _continue(self) -> None:
        if self.stopped is not None:
            try:
                os.kill(self.stopped, signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.stopped = None

    @precondition(lambda self: self.rig.gate.exists() and self.stopped is None and not self.shut)
    @rule()
    def flush(self) -> None:
        assert self.rig.processor.force_flush(60_000)
        st_ = self.rig.processor.statistics()
        assert st_.queued == 0 and st_.unacknowledged == 0, st_
        assert st_.accepted == st_.exported + st_.failed + st_.lost, st_

    @rule(twice=st.booleans())
    def shutdown_now(self, twice: bool) -> None:
        """No time to flush: what the writer has not written is lost (ABANDONED, from any phase)."""
        self._continue()
        self.shutdown(0, twice)

    @precondition(lambda self: self.rig.gate.exists() and self.stopped is None)
    @rule(twice=st.booleans())
    def shutdown_flushed(self, twice: bool) -> None:
        self.shutdown(60_000, twice)

    def shutdown(self, timeout_millis: int, twice: bool) -> None:
        self.rig.processor.shutdown(timeout_millis)
        self.shut = True
        self.phase_moves_forward()
        if twice:
            self.rig.processor.shutdown(60_000)  # returns at once: the first one's phase stays

    @invariant()
    def phase_moves_forward(self) -> None:
        phase = self.rig.processor.statistics().phase
        assert phase >= self.phase, f"invariant phase_moves_forward: {phase!r} after {self.phase!r}"
        self.phase = phase
        assert (phase is ExportPhase.OPEN) is not self.shut, f"invariant phase_moves_forward: {phase!r}, shut {self.shut}"

    @invariant()
    def every_span_ended_is_accepted_or_dropped(self) -> None:
        st_ = self.rig.processor.statistics()
        assert st_.accepted + st_.dropped == len(self.rig.ended), st_

    @invariant()
    def every_accepted_span_is_somewhere(self) -> None:
        st_ = self.rig.processor.statistics()
        assert st_.accepted == st_.exported + st_.failed + st_.lost + st_.queued + st_.unacknowledged, st_

    @invariant()
    def no_span_is_counted_twice(self) -> None:
        st_ = self.rig.processor.statistics()
        assert st_.exported + st_.failed + st_.lost + st_.queued <= st_.accepted, st_

    @invariant()
    def every_loss_reaches_the_drop_counter(self) -> None:
        st_ = self.rig.processor.statistics()
        assert self.rig.drops.dropped == st_.dropped + st_.failed + st_.lost, (self.rig.drops.dropped, st_)

    @invariant()
    def restarts_follow_deaths(self) -> None:
        assert self.rig.processor.statistics().restarts <= self.kills

    def teardown(self) -> None:
        try:
            self._continue()
            self.rig.gate.touch()
            self.rig.provider.shutdown()
            self.shut = True
            self.phase_moves_forward()
            self.rig.check_accounts()
            st_ = self.rig.processor.statistics()
            assert st_.queued == 0 and st_.unacknowledged == 0, st_
        finally:
            self.receiver.close()
            shutil.rmtree(self.tmp, ignore_errors=True)


ExportChildModel.TestCase.settings = settings(max_examples=6, stateful_step_count=10, deadline=None,
                                              suppress_health_check=list(HealthCheck))
test_export_child_model = ExportChildModel.TestCase
