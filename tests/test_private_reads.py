"""Tests read ``statistics()`` and public properties, not the library's private fields (issue #36).

Counted from the source (AST): every attribute access ``x._name`` in ``tests/`` (and
``getattr(x, "_name")``), except on ``self``/``cls`` (a test's own state), the namedtuple API
(``_replace``, ``_asdict``...) and other packages' internals, listed by file (:data:`FOREIGN`: not
ours to give a snapshot; by file, so a read of ours under the same name still counts). What is left
reaches into rmqtrace's objects. Some of it is on purpose, listed in :data:`EXEMPT` by file with
the reason: a fault injected by replacing a private
method or lock, a race reproduced by driving the private steps in a chosen order, a model reading
the state it checks under the object's own lock, a leak check of an internal table or thread.
The rest must not grow past :data:`MAX_REMAINING`: a test that needs to know something a user
would want too reads it from ``statistics()`` (add the field), not from the private attribute.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

from conftest import REPO

TESTS = REPO / "tests"

# The namedtuple API and the interpreter's own underscored names: public despite the underscore.
PUBLIC_UNDERSCORED = frozenset({"_replace", "_asdict", "_fields", "_make", "_field_defaults", "_exit", "_getframe"})

# Other packages' internals (and the tests' fakes of them), by (file, name), with whose they are.
_SDK_PROVIDER = "opentelemetry-sdk TracerProvider and its SynchronousMultiSpanProcessor"
FOREIGN: dict[tuple[str, str], str] = {
    ("test_config_env.py", "_active_span_processor"): _SDK_PROVIDER,
    ("test_review35.py", "_active_span_processor"): _SDK_PROVIDER,
    ("test_review35.py", "_span_processors"): _SDK_PROVIDER,
    ("test_export_child.py", "_active_span_processor"): _SDK_PROVIDER,
    ("test_layers.py", "_active_span_processor"): _SDK_PROVIDER,
    ("test_processor_chain.py", "_active_span_processor"): _SDK_PROVIDER,
    ("test_config_env.py", "_span_processors"): _SDK_PROVIDER,
    ("test_export_child.py", "_span_processors"): _SDK_PROVIDER,
    ("test_processor_chain.py", "_span_processors"): _SDK_PROVIDER,
    ("test_config_env.py", "_endpoint"): "opentelemetry OTLP exporters",
    ("test_semconv_conformance.py", "_events"): "opentelemetry-sdk Span (an event the SDK would refuse, injected)",
    ("test_rocketmq_real.py", "_check_dependency_conflicts"): "opentelemetry-instrumentation's BaseInstrumentor",
    ("test_failed_deliveries.py", "_self_wrapper"): "wrapt's FunctionWrapper (the instrumentor's patched methods)",
    ("test_collector_labels.py", "_labelnames"): "prometheus_client metrics",
    ("test_collector_labels.py", "_name"): "prometheus_client metrics",
    ("test_review34.py", "_actions"): "argparse",
    ("test_review34.py", "_SubParsersAction"): "argparse",
    ("fault_programs/consumer.py", "_init_settings_event"): "the rocketmq 5.x client",
    ("rmq_real.py", "_init_settings_event"): "the rocketmq 5.x client",
    ("test_exposure.py", "_init_settings_event"): "the rocketmq 5.x client",
    ("rmq_real.py", "_rmqtrace_fix"): "a marker the test harness sets on the rocketmq 5.x client's function",
    ("test_rocketmq_real.py", "_Message__store_timestamp"): "the rocketmq 5.x client's Message (name-mangled)",
    ("legacy_programs/roundtrip.py", "_handle"): "the legacy rocketmq client",
    ("test_legacy_adapter.py", "_handle"): "the test's fake of the legacy rocketmq client's message",
    ("test_legacy_adapter.py", "_native"): "the test's fake of the legacy rocketmq client's message",
    ("test_priority_jobs.py", "_native"): "the same fake (test_legacy_adapter.FakeMessage): what the 2.x send carried",
    ("test_environ.py", "_parent"): "ast nodes (a parent pointer the test adds)",
}

# rmqtrace's private names read on purpose: (file, attribute) -> why no statistics() stands in.
EXEMPT: dict[tuple[str, str], str] = {
    # fault injection: a private method, lock or condition replaced, or a private step driven
    ("review30c/02_ahead_message_held_while_every_worker_hangs.py", "_backlog"): "a reviewer's script kept as "
        "written: it only prints which messages wait in the loop (its verdict reads statistics())",
    ("review38/03_key_error_overtake_real_proxy.py", "_port_open"): "a reviewer's script kept as written: "
        "it asks the test helper rmq_real whether the proxy answers (no rmqtrace object)",
    ("test_review35.py", "_spec"): "the child's exporter factory swapped for a printing one (its stdout is the finding)",
    ("test_review35.py", "_drops"): "a raising drops hook set after the constructor's plain-callable check",
    ("test_model_faults.py", "_feed"): "with prefetch, run()'s feeder thread's one pass, driven as a step",
    ("test_model_faults.py", "_lock"): "the fault model swaps the loop's lock for a guard and reads its lease table under it",
    ("test_model_faults.py", "_changed"): "the condition rebuilt on the swapped lock (fault injection)",
    ("test_model_faults.py", "_leases"): "per-lease deadlines and states under the loop's lock: no public snapshot has them",
    ("test_model_faults.py", "_acks"): "the ack queue's pending handles, under the loop's lock (which ack a fault hits)",
    ("test_model_faults.py", "_snapshot_locked"): "statistics() and the settling set in one critical section",
    ("test_model_faults.py", "_settling"): "statistics() and the settling set in one critical section",
    ("test_model_faults.py", "_core"): "the blame tracker's marks under its lock (the model's invariant on them)",
    ("test_model_faults.py", "_marks"): "the blame tracker's marks under its lock (the model's invariant on them)",
    ("test_model_faults.py", "_t"): "the blame tracker's latest time under its lock",
    ("test_consume_stop_bounds.py", "_give_back_backlog"): "a race reproduced by driving the loop's private steps",
    ("test_consume_stop_bounds.py", "_own"): "a race reproduced by driving the loop's private steps",
    ("test_consume_stop_bounds.py", "_leases"): "the one lease of that reproduced race",
    ("test_consume_stop_bounds.py", "_on_done"): "a race reproduced by driving the loop's private steps",
    ("test_consume_stop_bounds.py", "_start_handler"): "a race reproduced by driving the loop's private steps",
    ("test_consume_stop_bounds.py", "_runner"): "the push consumer's runner, driven step by step",
    ("test_loop_broker_faults.py", "_keeper"): "the lease keeper's close replaced (fault injection)",
    ("test_loop_broker_faults.py", "_start_handler"): "a race reproduced by driving the loop's private steps",
    ("test_loop_broker_faults.py", "_lock"): "which locks an interrupted call left held (fault injection)",
    ("test_loop_broker_faults.py", "_stop"): "which locks an interrupted call left held (fault injection)",
    ("test_consume_faults.py", "_lock"): "a KeyboardInterrupt injected while the loop's lock is held",
    ("test_telemetry_cost.py", "_stock"): "the span writer's inline sampler switched off, to compare with the sampler's call",
    ("test_telemetry_cost.py", "_ids"): "the id generator replaced, so both ways allocate the same ids",
    ("test_lease_lost_seams.py", "_seam_for"): "the instrumentor's wrappers called without a broker",
    ("test_lease_lost_seams.py", "_receive"): "the instrumentor's wrappers called without a broker",
    ("test_lease_lost_seams.py", "_ack"): "the instrumentor's wrappers called without a broker",
    ("test_lease_lost_seams.py", "_change_invisible"): "the instrumentor's wrappers called without a broker",
    ("test_telemetry_faults.py", "_receive"): "the instrumentor's wrappers called without a broker",
    ("test_telemetry_faults.py", "_ack"): "the instrumentor's wrappers called without a broker",
    ("test_telemetry_faults.py", "_change_invisible"): "the instrumentor's wrappers called without a broker",
    ("test_reliability_input.py", "_properties"): "a bad properties mapping injected into an embedded Message",
    ("test_hold_expiry_skip.py", "_expire_at"): "the reference hold made to scan at every hold, as before the bound",
    ("test_legacy_adapter.py", "_NativeReader"): "the adapter's native reader rebuilt over the test's fake natives",
    ("test_numeric_bounds.py", "_tick"): "the loop's tick period derived from renew_margin (no statistic carries a period)",
    ("export_child_helpers.py", "_lock"): "the test helper's own receiver (OtlpReceiver, test-local)",
    # equivalence of two implementations, internal state included
    ("test_skew_bulk.py", "_windows"): "the bulk skew path's windows equal the reference path's, field by field",
    ("test_model_scheduler.py", "_bufs"): "the model cannot know the random routing: it reads it",
    ("test_compiled.py", "_no_hints"): "the fallback decorator used when mypyc is absent",
    # leak checks: an internal thread joined, an internal table or buffer bounded
    ("test_loop_broker_faults.py", "_upcoming"): "the scheduler's look-ahead buffer stays within its bound",
    ("test_dispatch_engine.py", "_watchdog"): "the watchdog thread joined (it outlived the test before)",
    ("test_dispatch_incident.py", "_watch_futs"): "a leak check: each timed-out wait took its future with it",
    ("test_consume_incidents.py", "_ack_workers"): "the loop's ack threads joined (a thread leak check)",
    ("test_model_consume.py", "_ack_workers"): "the loop's ack threads joined (a thread leak check)",
    ("test_collectors.py", "_refresher"): "the multiprocess refresher thread joined after unregister (a thread leak check)",
    ("test_collectors.py", "_thread"): "the multiprocess refresher thread joined after unregister (a thread leak check)",
    ("test_model_keep.py", "_handler"): "the live handler span the invariant is about (handler_context() also answers for "
                                        "held and compact traces: the invariant would widen)",
}

# rmqtrace's private names tests still read that are neither exempt nor foreign: none may come back.
MAX_REMAINING = 0


def _private_accesses(path: Path) -> list[tuple[str, int]]:
    """Every ``x._name`` (and ``getattr(x, "_name")``) in one file, but on ``self``/``cls``: (name, line)."""
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        name: str | None = None
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            name = node.attr
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "setattr")
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            name = node.args[1].value
        if name and name.startswith("_") and not name.startswith("__") and name not in PUBLIC_UNDERSCORED:
            found.append((name, node.lineno))
    return found


def census() -> tuple[Counter[tuple[str, str]], Counter[tuple[str, str]], list[str]]:
    """The foreign and the exempt accesses by (file, name), and every other one as ``file:line name``."""
    foreign: Counter[tuple[str, str]] = Counter()
    exempt: Counter[tuple[str, str]] = Counter()
    remaining: list[str] = []
    for path in sorted(TESTS.rglob("*.py")):
        if path.name == Path(__file__).name:
            continue
        rel = str(path.relative_to(TESTS))
        for name, line in _private_accesses(path):
            if (rel, name) in FOREIGN:
                foreign[(rel, name)] += 1
            elif (rel, name) in EXEMPT:
                exempt[(rel, name)] += 1
            else:
                remaining.append(f"{rel}:{line} {name}")
    return foreign, exempt, remaining


def test_tests_read_statistics_not_private_fields() -> None:
    _foreign, _exempt, remaining = census()
    assert len(remaining) <= MAX_REMAINING, (
        f"{len(remaining)} private reads of rmqtrace objects in tests (at most {MAX_REMAINING}): read statistics() "
        f"or a public property, or list the read in EXEMPT with its reason: {remaining}")


def test_every_listed_read_is_still_made() -> None:
    foreign, exempt, _ = census()
    stale = sorted(set(EXEMPT) - set(exempt)) + sorted(set(FOREIGN) - set(foreign))
    assert not stale, f"EXEMPT or FOREIGN lists reads no test makes any more: {stale}"
