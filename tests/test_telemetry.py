import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased
from opentelemetry.trace import SpanKind, StatusCode

from tracer.path.clock import ManualClock
from tracer.path.message import ClientFacts, MessageInfo
from tracer.path.stages import GAPS, Outcome, Stage
from tracer.telemetry.metrics import TracerMetrics
from tracer.telemetry.tracer import MessageTracer

MS = 1_000_000


def run_one(mt: MessageTracer, clock: ManualClock, props: dict[str, str], fail: bool = False,
            inside=None) -> None:
    info = MessageInfo(topic="T", message_id="M1", tag="tg", keys=("k1",), properties=props,
                       store_ms=clock.now_ns() // MS - 1, delivery_attempt=1, body_size=5)
    t = mt.start_message(info)
    clock.advance(2 * MS)
    t.mark(Stage.DISPATCH_ENQUEUE)
    clock.advance(30 * MS)
    err = None
    with t.handler_scope():
        if inside:
            inside()
        clock.advance(10 * MS)
        if fail:
            err = ValueError("bad")
    t.finish(Outcome.FAILURE if fail else Outcome.SUCCESS, err)


def produce(mt: MessageTracer, clock: ManualClock) -> dict[str, str]:
    props: dict[str, str] = {}
    st = mt.start_send("T", props.__setitem__, tag="tg", keys=("k1",))
    clock.advance(1 * MS)
    st.end(message_id="M1")
    clock.advance(5 * MS)
    return props


def test_one_trace_from_producer_to_handler_with_gap_children(spans, registry):
    provider, exporter = spans
    clock = ManualClock()
    prod = MessageTracer(tracer_provider=provider, clock=clock)
    cons = MessageTracer(consumer_group="G", tracer_provider=provider, metrics=TracerMetrics(registry), clock=clock)
    user_tracer = provider.get_tracer("user")
    run_one(cons, clock, produce(prod, clock), inside=lambda: user_tracer.start_span("user-work").end())

    by_name = {s.name: s for s in exporter.get_finished_spans()}
    assert set(by_name) == {"send T", "process T", "broker_wait", "client_buffer", "dispatch_wait", "handler",
                            "user-work"}
    send, process = by_name["send T"], by_name["process T"]
    assert send.kind is SpanKind.PRODUCER and process.kind is SpanKind.CONSUMER
    assert len({s.context.trace_id for s in by_name.values()}) == 1
    assert process.parent.span_id == send.context.span_id
    for name in ("broker_wait", "client_buffer", "dispatch_wait", "handler"):
        child = by_name[name]
        assert child.parent.span_id == process.context.span_id
        # every child inside process: no span of ours starts before its parent (Jaeger's skew check)
        assert process.start_time <= child.start_time <= child.end_time <= process.end_time
    assert by_name["broker_wait"].start_time == process.start_time  # process starts at the broker's store
    assert by_name["user-work"].parent.span_id == by_name["handler"].context.span_id
    # children tile the consumer side in stage order
    order = [by_name[n] for n in ("broker_wait", "client_buffer", "dispatch_wait", "handler")]
    assert all(a.end_time == b.start_time for a, b in zip(order, order[1:]))
    assert by_name["dispatch_wait"].end_time - by_name["dispatch_wait"].start_time == 30 * MS
    attrs = process.attributes
    assert attrs["messaging.system"] == "rocketmq"
    assert attrs["messaging.destination.name"] == "T"
    assert attrs["messaging.consumer.group.name"] == "G"
    assert attrs["messaging.message.id"] == "M1"
    assert attrs["messaging.rocketmq.message.tag"] == "tg"
    assert list(attrs["messaging.rocketmq.message.keys"]) == ["k1"]
    assert send.attributes["messaging.operation.type"] == "send"


def test_histograms_count_every_message_and_carry_exemplars(spans, registry):
    provider, _ = spans
    clock = ManualClock()
    prod = MessageTracer(tracer_provider=provider, clock=clock)
    cons = MessageTracer(consumer_group="G", tracer_provider=provider, metrics=TracerMetrics(registry), clock=clock)
    n = 25
    for i in range(n):
        run_one(cons, clock, produce(prod, clock), fail=(i % 5 == 0))
    for g in GAPS:
        count = registry.get_sample_value("rmqtrace_stage_duration_seconds_count",
                                          {"stage": g.name, "topic": "T", "consumer_group": "G"})
        assert count == n, g.name
    assert registry.get_sample_value("rmqtrace_stage_duration_seconds_bucket",
                                     {"stage": "dispatch_wait", "topic": "T", "consumer_group": "G", "le": "0.025"}) == 0
    assert registry.get_sample_value("rmqtrace_stage_duration_seconds_bucket",
                                     {"stage": "dispatch_wait", "topic": "T", "consumer_group": "G", "le": "0.05"}) == n
    assert registry.get_sample_value("rmqtrace_messages_total",
                                     {"topic": "T", "consumer_group": "G", "outcome": "failure"}) == 5
    assert registry.get_sample_value("rmqtrace_messages_total",
                                     {"topic": "T", "consumer_group": "G", "outcome": "success"}) == 20
    from prometheus_client.openmetrics.exposition import generate_latest
    text = generate_latest(registry).decode()
    assert '# {trace_id="' in text  # exemplars link buckets to traces


def test_failure_marks_spans_and_records_the_exception(spans, registry):
    provider, exporter = spans
    clock = ManualClock()
    cons = MessageTracer(consumer_group="G", tracer_provider=provider, metrics=TracerMetrics(registry), clock=clock)
    run_one(cons, clock, {}, fail=True)
    by_name = {s.name: s for s in exporter.get_finished_spans()}
    assert by_name["process T"].status.status_code is StatusCode.ERROR
    assert by_name["handler"].status.status_code is StatusCode.ERROR
    assert by_name["handler"].events[0].name == "exception"
    assert by_name["process T"].parent is None  # no producer context: a new trace


def test_unsampled_messages_cost_no_spans_but_still_count(registry):
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ParentBased(ALWAYS_OFF))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    clock = ManualClock()
    cons = MessageTracer(consumer_group="G", tracer_provider=provider, metrics=TracerMetrics(registry), clock=clock)
    run_one(cons, clock, {})
    assert exporter.get_finished_spans() == ()
    assert registry.get_sample_value("rmqtrace_stage_duration_seconds_count",
                                     {"stage": "handler", "topic": "T", "consumer_group": "G"}) == 1


def test_remote_unsampled_parent_is_respected(spans, registry):
    provider, exporter = spans  # default sampler is ParentBased(ALWAYS_ON)
    clock = ManualClock()
    cons = MessageTracer(consumer_group="G", tracer_provider=provider, metrics=TracerMetrics(registry), clock=clock)
    run_one(cons, clock, {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"})
    assert exporter.get_finished_spans() == ()


def test_skew_is_clamped_counted_and_bounded(spans, registry):
    provider, _ = spans
    clock = ManualClock()
    metrics = TracerMetrics(registry)
    cons = MessageTracer(consumer_group="G", tracer_provider=provider, metrics=metrics, clock=clock)
    # producer clock 50 ms ahead of the broker's
    props = {"rmqtrace_produce_ns": str(clock.now_ns() + 50 * MS)}
    run_one(cons, clock, props)
    assert registry.get_sample_value("rmqtrace_clock_skew_clamped_total", {"stage": "send"}) == 1
    bound = registry.get_sample_value("rmqtrace_clock_skew_bound_seconds", {"peer": "producer->broker"})
    assert -0.052 < bound < -0.049
    assert registry.get_sample_value("rmqtrace_stage_duration_seconds_sum",
                                     {"stage": "send", "topic": "T", "consumer_group": "G"}) == 0.0


def test_no_sdk_provider_means_no_spans_and_no_errors(registry):
    clock = ManualClock()
    cons = MessageTracer(consumer_group="G", tracer_provider=trace.NoOpTracerProvider(),
                         metrics=TracerMetrics(registry), clock=clock)
    run_one(cons, clock, {})
    assert registry.get_sample_value("rmqtrace_messages_total",
                                     {"topic": "T", "consumer_group": "G", "outcome": "success"}) == 1


def test_finish_is_idempotent_and_listeners_see_each_message_once(spans):
    provider, _ = spans
    seen = []
    cons = MessageTracer(tracer_provider=provider, listeners=[lambda t, o: seen.append(o)])
    t = cons.start_message(MessageInfo(topic="T"))
    with t.handler_scope():
        pass
    t.finish(Outcome.SUCCESS)
    t.finish(Outcome.FAILURE)
    assert seen == [Outcome.SUCCESS]


def test_topic_labels_are_bounded(registry):
    metrics = TracerMetrics(registry, label_limit=3)
    cons = MessageTracer(metrics=metrics)
    for i in range(10):
        t = cons.start_message(MessageInfo(topic=f"topic-{i}"))
        with t.handler_scope():
            pass
        t.finish(Outcome.SUCCESS)
    topics = {s.labels["topic"] for m in registry.collect() if m.name == "rmqtrace_messages" for s in m.samples}
    assert topics == {"topic-0", "topic-1", "topic-2", "other"}


# -- issue 12: sampling, the process span's extent, limits, processors, conventions ------------------
class RecordingSampler:
    """ParentBased(ALWAYS_ON)'s decisions, remembering what each call saw."""

    def __init__(self):
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON
        self.inner = ParentBased(ALWAYS_ON)
        self.calls = []

    def should_sample(self, parent_context, trace_id, name, kind=None, attributes=None, links=None, trace_state=None):
        self.calls.append((name, dict(attributes or {}), list(links or ())))
        return self.inner.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)

    def get_description(self):
        return "recording"


def _provider(**kw):
    exporter = InMemorySpanExporter()
    provider = TracerProvider(**kw)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def test_unsampled_messages_make_no_orphan_traces():
    from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
    provider, exporter = _provider(sampler=ParentBased(TraceIdRatioBased(0.5)))
    clock = ManualClock()
    prod = MessageTracer(tracer_provider=provider, clock=clock)
    cons = MessageTracer(consumer_group="G", tracer_provider=provider, clock=clock)
    user = provider.get_tracer("user")
    for i in range(40):
        props = produce(prod, clock) if i % 2 else {}  # half with a producer context, half without
        run_one(cons, clock, props, inside=lambda: user.start_span("user-work").end())
    finished = exporter.get_finished_spans()
    sampled_traces = {s.context.trace_id for s in finished if s.name.startswith("process")}
    users = [s for s in finished if s.name == "user-work"]
    assert 0 < len(sampled_traces) < 40  # the ratio dropped some and kept some
    assert all(u.parent is not None and u.context.trace_id in sampled_traces for u in users)
    assert len(users) == len(sampled_traces)


def test_dropped_process_keeps_the_producers_context_current_in_the_handler():
    provider, exporter = _provider(sampler=ALWAYS_OFF)
    clock = ManualClock()
    cons = MessageTracer(consumer_group="G", tracer_provider=provider, clock=clock)
    seen = []
    run_one(cons, clock, {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
            inside=lambda: seen.append(trace.get_current_span().get_span_context()))
    assert seen[0].trace_id == 0x0AF7651916CD43DD8448EB211C80319C and not seen[0].trace_flags.sampled
    assert exporter.get_finished_spans() == ()


def test_process_starts_at_the_store_and_broker_wait_is_its_first_child(spans):
    provider, exporter = spans
    clock = ManualClock()
    prod = MessageTracer(tracer_provider=provider, clock=clock)
    cons = MessageTracer(consumer_group="G", tracer_provider=provider, clock=clock)
    run_one(cons, clock, produce(prod, clock))
    by_name = {s.name: s for s in exporter.get_finished_spans()}
    process, broker_wait = by_name["process T"], by_name["broker_wait"]
    # store -> broker wait -> pull -> 2 ms client buffer -> 30 ms dispatch wait -> 10 ms handler
    pull = process.attributes["rmqtrace.stamp.client_pull_ns"]
    assert process.end_time - pull == 42 * MS  # what messaging.process.duration records
    assert process.attributes["rmqtrace.stamp.broker_store_ns"] == process.start_time == broker_wait.start_time
    assert broker_wait.parent.span_id == process.context.span_id
    assert broker_wait.end_time == pull and broker_wait.start_time < pull
    assert broker_wait.attributes["rmqtrace.stage"] == "broker_wait"


def test_span_limits_apply_to_consumer_spans():
    from opentelemetry.sdk.trace import SpanLimits
    provider, exporter = _provider(span_limits=SpanLimits(max_span_attributes=5, max_events=1))
    clock = ManualClock()
    cons = MessageTracer(consumer_group="G", tracer_provider=provider, clock=clock)

    def busy_handler():
        span = trace.get_current_span()
        for i in range(9):
            span.set_attribute(f"user.{i}", i)
            span.add_event(f"e{i}")
    run_one(cons, clock, {}, inside=busy_handler)
    finished = exporter.get_finished_spans()
    assert finished and all(len(s.attributes) <= 5 for s in finished)
    by_name = {s.name: s for s in finished}
    assert by_name["process T"].dropped_attributes > 0
    assert len(by_name["handler"].events) == 1 and by_name["handler"].dropped_events == 8


def test_the_sampler_sees_sampling_attributes_and_the_creation_link():
    sampler = RecordingSampler()
    provider, exporter = _provider(sampler=sampler)
    clock = ManualClock()
    prod = MessageTracer(tracer_provider=provider, clock=clock)
    cons = MessageTracer(consumer_group="G", tracer_provider=provider, clock=clock)
    run_one(cons, clock, produce(prod, clock))
    calls = {name: (attrs, links) for name, attrs, links in sampler.calls}
    send_attrs, _ = calls["send T"]
    assert send_attrs["messaging.system"] == "rocketmq" and send_attrs["messaging.destination.name"] == "T"
    assert send_attrs["messaging.operation.name"] == "send"
    proc_attrs, proc_links = calls["process T"]
    assert proc_attrs["messaging.consumer.group.name"] == "G" and proc_attrs["messaging.operation.type"] == "process"
    send = next(s for s in exporter.get_finished_spans() if s.name == "send T")
    assert [link.context.span_id for link in proc_links] == [send.context.span_id]
    process = next(s for s in exporter.get_finished_spans() if s.name == "process T")
    assert [link.context.span_id for link in process.links] == [send.context.span_id]


def test_processors_on_start_sees_the_consumer_spans(spans):
    from opentelemetry.sdk.trace import SpanProcessor
    provider, exporter = spans
    started = []

    class Enricher(SpanProcessor):
        def on_start(self, span, parent_context=None):
            started.append(span.name)
            span.set_attribute("enriched", True)

    provider.add_span_processor(Enricher())
    clock = ManualClock()
    cons = MessageTracer(consumer_group="G", tracer_provider=provider, clock=clock)
    run_one(cons, clock, {})
    assert {"process T", "handler"} <= set(started)
    by_name = {s.name: s for s in exporter.get_finished_spans()}
    assert by_name["process T"].attributes["enriched"] is True and by_name["handler"].attributes["enriched"] is True


def test_conventions_error_type_namespace_type_client_and_server():
    from tracer.path.names import SCHEMA_URL
    provider, exporter = _provider()
    clock = ManualClock()
    cons = MessageTracer(consumer_group="G", tracer_provider=provider, clock=clock,
                         client=ClientFacts("host@1@c", "ns1", "proxy.local", 8081))
    run_one(cons, clock, {}, fail=True)
    by_name = {s.name: s for s in exporter.get_finished_spans()}
    a = by_name["process T"].attributes
    assert a["error.type"] == "ValueError" and by_name["handler"].attributes["error.type"] == "ValueError"
    assert a["messaging.rocketmq.namespace"] == "ns1"
    assert a["messaging.rocketmq.message.type"] == "normal"
    assert a["messaging.client.id"] == "host@1@c"
    assert a["server.address"] == "proxy.local" and a["server.port"] == 8081
    assert "messaging.message.body.size" not in a  # opt-in
    assert a["rmqtrace.delivery_attempt"] == 1 and "messaging.rocketmq.message.delivery_attempt" not in a
    assert by_name["process T"].instrumentation_scope.schema_url == SCHEMA_URL
    prod = MessageTracer(tracer_provider=provider, clock=clock, record_body_size=True)
    prod.start_send("T", {}.__setitem__, body_size=7).end()
    send = next(s for s in exporter.get_finished_spans() if s.name == "send T")
    assert send.attributes["messaging.message.body.size"] == 7
    assert send.instrumentation_scope.schema_url == SCHEMA_URL


def test_a_failure_without_an_exception_still_has_an_error_type(spans):
    provider, exporter = spans
    cons = MessageTracer(consumer_group="G", tracer_provider=provider)
    t = cons.start_message(MessageInfo(topic="T", message_group="g1"))
    with t.handler_scope():
        pass
    t.finish(Outcome.FAILURE)
    process = next(s for s in exporter.get_finished_spans() if s.name == "process T")
    assert process.attributes["error.type"] == "failure"
    assert process.attributes["messaging.rocketmq.message.type"] == "fifo"


def test_the_report_reads_what_the_tracer_writes(tmp_path):
    from tracer.report.model import messages_from_spans
    from tracer.telemetry.spanfile import JsonLinesSpanExporter, read_spans
    path = tmp_path / "spans.jsonl"
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(path)))
    clock = ManualClock()
    cons = MessageTracer(consumer_group="G", tracer_provider=provider, clock=clock)
    t = cons.start_message(MessageInfo(topic="T", message_id="M9", delivery_attempt=3,
                                       store_ms=clock.now_ns() // MS - 1))
    with t.handler_scope():
        clock.advance(MS)
    t.finish(Outcome.SUCCESS)
    provider.shutdown()
    (record,) = messages_from_spans(read_spans(path))
    assert (record.message_id, record.group, record.attempt) == ("M9", "G", 3)


def test_with_another_sdk_the_handler_still_runs_in_the_producers_context():
    class VendorProvider(trace.TracerProvider):  # records somewhere, but is not the OpenTelemetry SDK
        def get_tracer(self, *args, **kwargs):
            return trace.NoOpTracer()

    clock = ManualClock()
    cons = MessageTracer(consumer_group="G", tracer_provider=VendorProvider(), clock=clock)
    seen = []
    run_one(cons, clock, {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
            inside=lambda: seen.append(trace.get_current_span().get_span_context()))
    assert seen[0].trace_id == 0x0AF7651916CD43DD8448EB211C80319C and seen[0].span_id == 0xB7AD6B7169203331
    assert not trace.get_current_span().get_span_context().is_valid  # detached after the handler


def test_a_metrics_only_message_costs_no_traceparent_parse_and_a_written_span_counts_a_bad_one_once(spans, registry):
    # The traceparent is parsed only when a span is written (or the context made current): a
    # malformed one is counted then, once, however often the trace's `carried` is read.
    provider, exporter = spans
    clock = ManualClock()
    bad = {"traceparent": "garbage", "rmqtrace_produce_ns": str(clock.now_ns() - 5 * MS)}
    metrics_only = MessageTracer(consumer_group="G", tracer_provider=trace.NoOpTracerProvider(),
                                 metrics=TracerMetrics(registry), clock=clock)
    run_one(metrics_only, clock, bad)
    assert metrics_only.errors.counts["traceparent_malformed"] == 0
    assert registry.get_sample_value("rmqtrace_messages_total", {"topic": "T", "consumer_group": "G",
                                                                 "outcome": "success"}) == 1

    traced = MessageTracer(consumer_group="G", tracer_provider=provider, clock=clock)
    seen = []
    traced.listeners.append(lambda t, _o: seen.extend([t.carried.parent, t.carried.parent]))
    run_one(traced, clock, bad)
    assert traced.errors.counts["traceparent_malformed"] == 1
    assert seen == [None, None]
    process = next(s for s in exporter.get_finished_spans() if s.name == "process T")
    assert process.parent is None  # a new trace, as before: the bad value is ignored


def test_a_deferred_traceparent_still_parents_the_process_span(spans):
    provider, exporter = spans
    clock = ManualClock()
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    mt = MessageTracer(consumer_group="G", tracer_provider=provider, clock=clock)
    run_one(mt, clock, {"traceparent": tp, "tracestate": "vendor=abc"})
    process = next(s for s in exporter.get_finished_spans() if s.name == "process T")
    assert process.context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert process.parent.span_id == 0xB7AD6B7169203331
    assert process.context.trace_state.get("vendor") == "abc"
    assert sum(mt.errors.counts.values()) == 0


def test_the_probes_parts_fit_the_whole_when_the_store_time_rounds_down(spans, registry):
    """Issue 19: broker_wait 2.02 ms and consumer_wait 0.36 ms inside an end_to_end of 1.70 ms,
    because the store time (1 ms resolution) rounded to before the produce stamp."""
    provider, exporter = spans
    clock = ManualClock(1_700_000_000_000_000_000 + 700_000)  # 0.7 ms into a millisecond
    prod = MessageTracer(tracer_provider=provider, clock=clock)
    cons = MessageTracer(consumer_group="G", tracer_provider=provider, metrics=TracerMetrics(registry), clock=clock)
    props: dict[str, str] = {}
    send = prod.start_send("T", props.__setitem__)
    clock.advance(200_000)
    store_ms = clock.now_ns() // MS  # stored 0.2 ms after the produce stamp; the broker says .000
    send.end("M1")
    clock.advance(1_100_000)
    t = cons.start_message(MessageInfo(topic="T", message_id="M1", properties=props, store_ms=store_ms))
    clock.advance(100_000)
    with t.handler_scope():
        clock.advance(300_000)
    t.finish(Outcome.SUCCESS)

    def total(stage: str) -> float:
        return registry.get_sample_value("rmqtrace_stage_duration_seconds_sum",
                                         {"topic": "T", "consumer_group": "G", "stage": stage})

    whole = total("end_to_end")
    assert whole == pytest.approx(0.0017)
    for g in GAPS:
        assert 0 <= total(g.name) <= whole + 1e-12, g.name
    assert total("send") + total("broker_wait") + total("consumer_wait") + total("handler") == pytest.approx(whole)
    by_name = {s.name: s for s in exporter.get_finished_spans()}
    for s in by_name.values():  # no span of ours starts before its parent
        if s.parent is not None:
            parent = next(p for p in by_name.values() if p.context.span_id == s.parent.span_id)
            assert s.start_time >= parent.start_time, (s.name, parent.name)


def test_message_tracer_takes_one_client_facts_object_and_the_loose_keywords_still_work(spans):
    provider, exporter = spans
    facts = ClientFacts("host@1@c", "ns", "broker.example", 8081)
    one = MessageTracer(consumer_group="G", tracer_provider=provider, client=facts)
    with pytest.warns(DeprecationWarning):  # tests/test_tracer_config.py: one warning test per keyword
        loose = MessageTracer(consumer_group="G", tracer_provider=provider, client_id="host@1@c", namespace="ns",
                              server_address="broker.example", server_port=8081)
    assert one.client == loose.client == facts and one.client_id == "host@1@c" and one.namespace == "ns"
    with pytest.warns(DeprecationWarning):
        mixed = MessageTracer(tracer_provider=provider, client=facts, client_id="other")
    assert mixed.client == facts._replace(client_id="other")  # a loose keyword overrides its field
    mixed.describe_client(ClientFacts("ignored", "ignored", "ignored", 1))  # given facts win
    assert mixed.client == facts._replace(client_id="other")
    with pytest.raises(ValueError, match="server_port"):
        MessageTracer(tracer_provider=provider, client=ClientFacts(server_address="x", server_port=70000))
    one.start_send("T", {}.__setitem__).end("M1")
    (send,) = exporter.get_finished_spans()
    assert send.attributes["messaging.client.id"] == "host@1@c" and send.attributes["server.port"] == 8081


def test_statistics_is_a_frozen_snapshot_with_hook_failures_by_place(spans):
    provider, _ = spans
    clock = ManualClock()

    def broken(trace, outcome):  # noqa: ANN001, ANN202
        raise RuntimeError("listener bug")

    cons = MessageTracer(consumer_group="G", tracer_provider=provider, clock=clock, listeners=[broken])
    for _ in range(3):
        run_one(cons, clock, {"traceparent": "00-zz-bad"})
    s = cons.statistics()
    assert s.hook_failures == {"a finish listener": 3}
    assert s.propagation_errors and s.keep is None and s.hold is None
    run_one(cons, clock, {})
    assert s.hook_failures == {"a finish listener": 3}  # a snapshot: later failures do not change it
    assert cons.statistics().hook_failures == {"a finish listener": 4}
    with pytest.raises(AttributeError):
        s.hook_failures = {}  # type: ignore[misc]


def test_the_compact_trace_is_one_process_span_with_every_gap_and_stamp_as_attributes(spans, monkeypatch):
    """Issue 20: RMQTRACE_TRACE_SHAPE=compact (or trace_shape="compact"): the cost of one span."""
    provider, exporter = spans
    clock = ManualClock()
    prod = MessageTracer(tracer_provider=provider, clock=clock)
    monkeypatch.setenv("RMQTRACE_TRACE_SHAPE", "compact")
    cons = MessageTracer(consumer_group="G", tracer_provider=provider, clock=clock)
    assert cons.compact
    user = provider.get_tracer("user")
    run_one(cons, clock, produce(prod, clock), fail=True, inside=lambda: user.start_span("user-work").end())
    by_name = {s.name: s for s in exporter.get_finished_spans()}
    assert set(by_name) == {"send T", "process T", "user-work"}
    process = by_name["process T"]
    assert by_name["user-work"].parent.span_id == process.context.span_id  # the user's spans nest under it
    attrs = process.attributes
    for g in GAPS:
        assert f"rmqtrace.gap.{g.name}_s" in attrs, g.name
    assert attrs["rmqtrace.gap.dispatch_wait_s"] == pytest.approx(0.030)
    assert attrs["rmqtrace.stamp.client_pull_ns"] == process.start_time  # the consumer's processing only
    assert process.status.status_code is StatusCode.ERROR and [e.name for e in process.events] == ["exception"]
    monkeypatch.setenv("RMQTRACE_TRACE_SHAPE", "tiny")
    with pytest.raises(ValueError, match="RMQTRACE_TRACE_SHAPE"):
        MessageTracer(tracer_provider=provider)
