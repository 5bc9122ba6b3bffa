import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracer.path.propagation import (
    COST,
    JOB_ID,
    PRODUCE_NS,
    TRACEPARENT,
    TRACESTATE,
    PropagationErrors,
    extract,
    inject,
    parse_traceparent,
    resolve,
)

NOW = time.time_ns()
TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def sc(carried):
    return carried.parent


def test_round_trip_through_properties(spans):
    provider, _ = spans
    tracer = provider.get_tracer("t")
    props: dict[str, str] = {}
    with tracer.start_as_current_span("send") as span:
        inject(props.__setitem__, NOW - 1000, job_id="job-7", cost=42)
        expected = span.get_span_context()
    errors = PropagationErrors()
    carried = extract(props, errors, NOW)
    got = sc(carried)
    assert (got.trace_id, got.span_id, got.is_remote) == (expected.trace_id, expected.span_id, True)
    assert carried.produce_ns == NOW - 1000 and carried.job_id == "job-7" and carried.cost == 42.0
    assert sum(errors.counts.values()) == 0


def test_reads_what_the_java_agent_writes():
    # the OpenTelemetry Java agent writes plain W3C keys into user properties
    carried = extract({TRACEPARENT: TP, TRACESTATE: "vendor=abc"}, PropagationErrors(), NOW)
    got = sc(carried)
    assert got.trace_id == 0x0AF7651916CD43DD8448EB211C80319C and got.trace_flags.sampled
    assert got.trace_state.get("vendor") == "abc"
    assert carried.produce_ns == 0  # a Java producer has no rmqtrace stamp: gaps from it are skipped


def test_system_trace_context_used_when_no_user_property():
    carried = extract({}, PropagationErrors(), NOW, system_trace_context=TP)
    assert sc(carried).span_id == 0xB7AD6B7169203331


def test_bad_values_are_counted_by_kind_never_raised():
    cases = {
        "traceparent_malformed": {TRACEPARENT: "garbage"},
        "traceparent_version": {TRACEPARENT: "ff" + TP[2:]},
        "traceparent_invalid_id": {TRACEPARENT: "00-" + "0" * 32 + "-b7ad6b7169203331-01"},
        "produce_ns_malformed": {PRODUCE_NS: "12abc"},
        "produce_ns_out_of_range": {PRODUCE_NS: str(NOW + 10**18)},
        "not_text": {TRACEPARENT: b"\xff\xfe"},
        "job_id_invalid": {JOB_ID: "x" * 1000},
        "cost_invalid": {COST: "nan-ish"},
        "tracestate_invalid": {TRACEPARENT: TP, TRACESTATE: "k=" + "v" * 600},
    }
    for kind, props in cases.items():
        errors = PropagationErrors()
        extract(props, errors, NOW)
        assert errors.counts[kind] == 1, kind


def test_version_00_with_extra_fields_is_rejected_but_future_versions_accepted():
    errors = PropagationErrors()
    assert parse_traceparent(TP + "-extra", None, errors) is None
    assert parse_traceparent("01" + TP[2:] + "-future", None, errors) is not None


def test_zero_and_future_timestamps_are_ignored():
    for raw in ("0", "1", str(NOW + 2 * 24 * 3600 * 10**9)):
        assert extract({PRODUCE_NS: raw}, PropagationErrors(), NOW).produce_ns == 0


def test_a_mapping_that_raises_is_survived():
    class Hostile(dict):
        def get(self, *a, **k):
            raise RuntimeError("boom")

    errors = PropagationErrors()
    assert extract(Hostile({"a": "b"}), errors, NOW).parent is None
    assert errors.counts["unreadable"] == 1


def test_error_hook_mirrors_counts():
    seen = []
    errors = PropagationErrors(on_count=seen.append)
    extract({TRACEPARENT: "nope"}, errors, NOW)
    assert seen == ["traceparent_malformed"]


def _hex(n: int) -> st.SearchStrategy[str]:
    return st.text("0123456789abcdef", min_size=n, max_size=n)


# well-formed shapes with random content: versions, zero ids, flags (cheaper than from_regex)
traceparent_like = st.builds(lambda v, t, s, f: f"{v}-{t}-{s}-{f}", _hex(2), _hex(32), _hex(16), _hex(2))
values = st.one_of(st.text(max_size=300), st.binary(max_size=80), st.integers(), st.none(), st.floats(),
                   st.just(TP), traceparent_like)
keys = st.sampled_from([TRACEPARENT, TRACESTATE, "baggage", PRODUCE_NS, JOB_ID, COST, "other"])


@settings(max_examples=3000, deadline=None)
@given(st.dictionaries(keys, values, max_size=6), st.one_of(st.none(), values))
def test_fuzz_extract_never_raises(props, system_ctx):
    errors = PropagationErrors()
    carried = extract(props, errors, NOW, system_trace_context=system_ctx)
    assert carried.produce_ns == 0 or 946_684_800 * 10**9 <= carried.produce_ns <= NOW + 24 * 3600 * 10**9
    if carried.parent is not None:
        assert sc(carried).is_valid


# -- issue 12 item 8: the global propagator (OTEL_PROPAGATORS) and baggage ----------------------
class KeyPropagator:
    """A non-W3C propagator (as OTEL_PROPAGATORS=<custom> would install): one ``x-ctx`` key."""

    fields = {"x-ctx"}

    def inject(self, carrier, context=None, setter=None):
        from opentelemetry import trace as t
        sc = t.get_current_span(context).get_span_context()
        if sc.is_valid:
            setter.set(carrier, "x-ctx", f"{sc.trace_id:032x}:{sc.span_id:016x}")

    def extract(self, carrier, context=None, getter=None):
        from opentelemetry import trace as t
        from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
        got = getter.get(carrier, "x-ctx")
        if not got:
            return context
        tid, sid = got[0].split(":")
        sc = SpanContext(int(tid, 16), int(sid, 16), is_remote=True, trace_flags=TraceFlags(1))
        return t.set_span_in_context(NonRecordingSpan(sc), context)


@pytest.fixture
def global_propagator():
    from opentelemetry import propagate
    before = propagate.get_global_textmap()
    yield propagate.set_global_textmap
    propagate.set_global_textmap(before)


def test_a_configured_global_propagator_carries_the_context(spans, global_propagator):
    from tracer.clients.producer import TracedProducer  # noqa: F401 - the same path the wrappers use
    from tracer.path.clock import ManualClock
    from tracer.path.message import MessageInfo
    from tracer.path.stages import Outcome
    from tracer.telemetry.tracer import MessageTracer
    global_propagator(KeyPropagator())
    provider, exporter = spans
    clock = ManualClock()
    props: dict[str, str] = {}
    MessageTracer(tracer_provider=provider, clock=clock).start_send("T", props.__setitem__).end()
    assert "x-ctx" in props and TRACEPARENT not in props and PRODUCE_NS in props
    t = MessageTracer(tracer_provider=provider, clock=clock).start_message(MessageInfo(topic="T", properties=props))
    with t.handler_scope():
        pass
    t.finish(Outcome.SUCCESS)
    by_name = {s.name: s for s in exporter.get_finished_spans()}
    assert by_name["process T"].parent.span_id == by_name["send T"].context.span_id


def test_baggage_travels_to_the_handler(spans):
    from opentelemetry import baggage
    from opentelemetry import context as otel_context

    from tracer.path.clock import ManualClock
    from tracer.path.message import MessageInfo
    from tracer.path.stages import Outcome
    from tracer.telemetry.tracer import MessageTracer
    provider, exporter = spans
    clock = ManualClock()
    props: dict[str, str] = {}
    token = otel_context.attach(baggage.set_baggage("tenant", "acme"))
    try:
        MessageTracer(tracer_provider=provider, clock=clock).start_send("T", props.__setitem__).end()
    finally:
        otel_context.detach(token)
    assert props["baggage"] == "tenant=acme"
    seen = []
    t = MessageTracer(tracer_provider=provider, clock=clock).start_message(MessageInfo(topic="T", properties=props))
    with t.handler_scope():
        seen.append(baggage.get_baggage("tenant"))
    t.finish(Outcome.SUCCESS)
    assert seen == ["acme"]
    by_name = {s.name: s for s in exporter.get_finished_spans()}
    assert by_name["process T"].parent.span_id == by_name["send T"].context.span_id


def test_a_deferred_traceparent_is_parsed_and_counted_by_resolve_only():
    errors = PropagationErrors()
    carried = extract({TRACEPARENT: "ff" + TP[2:], PRODUCE_NS: str(NOW - 1000)}, errors, NOW, defer_parent=True)
    assert carried.parent is None and carried.traceparent == "ff" + TP[2:] and carried.produce_ns == NOW - 1000
    assert sum(errors.counts.values()) == 0
    resolved = resolve(carried, errors)
    assert resolved.parent is None and resolved.traceparent is None and resolved.produce_ns == NOW - 1000
    assert errors.counts["traceparent_version"] == 1
    assert resolve(resolved, errors) is resolved and errors.counts["traceparent_version"] == 1

    good = resolve(extract({TRACEPARENT: TP, TRACESTATE: "vendor=abc"}, errors, NOW, defer_parent=True), errors)
    assert good.parent == sc(extract({TRACEPARENT: TP, TRACESTATE: "vendor=abc"}, errors, NOW))
    assert good.parent.trace_state.get("vendor") == "abc"


def test_baggage_is_not_deferred_it_needs_the_parent_now():
    carried = extract({TRACEPARENT: TP, "baggage": "k=v"}, PropagationErrors(), NOW, defer_parent=True)
    assert carried.traceparent is None and carried.parent is not None and carried.context is not None
