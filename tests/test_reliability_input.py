"""Bad input: whatever a message carries, the tracer counts it, logs it once per kind, and never
raises into the user's code — and every span it writes can still be exported.

Part one sends one message per bad-input class (three of each) through the whole consume path:
embedded broker → ``ConsumeLoop`` → tracer with metrics and an SDK provider. Part two fuzzes every
parser with hypothesis (``max_examples`` set on each; the counts actually run are recorded for
RELIABILITY.md).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest
from fault_programs.harness import record_figures
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.trace import TraceState
from prometheus_client import CollectorRegistry
from waiting import wait_until

from tracer.clients.consume import ConsumeLoop
from tracer.embedded import EmbeddedBroker, Message, Producer, SimpleConsumer
from tracer.path.message import describe
from tracer.path.propagation import (
    COST,
    JOB_ID,
    PRODUCE_NS,
    TRACEPARENT,
    TRACESTATE,
    PropagationErrors,
    extract,
    format_traceparent,
    parse_produce_ns,
    parse_traceparent,
    parse_tracestate,
    plausible_ns,
)
from tracer.path.stages import Outcome, Stage
from tracer.telemetry.metrics import TracerMetrics
from tracer.telemetry.tracer import MessageTracer, body_preview

NOW = time.time_ns()
TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
CASE = "rmqtrace_test_case"  # our own bookkeeping property; the tracer ignores unknown keys


class Collect(SpanProcessor):
    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.lock = threading.Lock()

    def on_end(self, span: Any) -> None:
        with self.lock:
            self.spans.append(span)


class RaisingMapping(dict):
    def get(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a properties mapping that raises")


class HostileAttributes:
    """A received message whose descriptive attributes raise; what the broker needs still works."""

    RAISING = ("properties", "keys", "tag", "message_group", "store_timestamp", "decode_message_timestamp",
               "delivery_attempt", "body", "trace_context")

    def __init__(self, msg: Message) -> None:
        object.__setattr__(self, "_msg", msg)

    def __getattr__(self, name: str) -> Any:
        if name in self.RAISING:
            raise RuntimeError(f"hostile attribute {name}")
        return getattr(self._msg, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._msg, name, value)


def _set(**attrs: Any):
    def mutate(m: Message) -> Message:
        for k, v in attrs.items():
            setattr(m, k, v)
        return m
    return mutate


def _props(mapping: Any):
    def mutate(m: Message) -> Message:
        m._properties = mapping
        return m
    return mutate


# (case, user properties, body, mutation of the received message, the error kind it must count)
CASES: list[tuple[str, dict[str, Any], Any, Any, str | None]] = [
    ("properties_missing", {}, b"x", None, None),
    ("traceparent_garbage", {TRACEPARENT: "garbage"}, b"x", None, "traceparent_malformed"),
    ("traceparent_version_ff", {TRACEPARENT: "ff" + TP[2:]}, b"x", None, "traceparent_version"),
    ("traceparent_v00_extra_field", {TRACEPARENT: TP + "-extra"}, b"x", None, "traceparent_version"),
    ("traceparent_short_trace_id", {TRACEPARENT: "00-" + "a" * 31 + "-b7ad6b7169203331-01"}, b"x", None,
     "traceparent_malformed"),
    ("traceparent_long_span_id", {TRACEPARENT: TP[:36] + "b7ad6b71692033311-01"}, b"x", None,
     "traceparent_malformed"),
    ("traceparent_zero_ids", {TRACEPARENT: "00-" + "0" * 32 + "-" + "0" * 16 + "-01"}, b"x", None,
     "traceparent_invalid_id"),
    ("traceparent_huge", {TRACEPARENT: "00-" + "a" * 1_000_000}, b"x", None, "traceparent_malformed"),
    ("traceparent_non_utf8", {TRACEPARENT: b"\xff\xfe\x00garbage"}, b"x", None, "not_text"),
    ("traceparent_not_text", {TRACEPARENT: 12345}, b"x", None, "not_text"),
    ("tracestate_garbage", {TRACEPARENT: TP, TRACESTATE: "!!not=a,,state"}, b"x", None, "tracestate_invalid"),
    ("tracestate_huge", {TRACEPARENT: TP, TRACESTATE: "k=" + "v" * 100_000}, b"x", None, "tracestate_invalid"),
    ("tracestate_33_members", {TRACEPARENT: TP, TRACESTATE: ",".join(f"k{i}=v" for i in range(33))}, b"x", None,
     "tracestate_invalid"),
    ("produce_ns_garbage", {PRODUCE_NS: "12abc"}, b"x", None, "produce_ns_malformed"),
    ("produce_ns_fullwidth_digits", {PRODUCE_NS: "１２３４５６７８９"}, b"x", None, "produce_ns_malformed"),
    ("produce_ns_negative", {PRODUCE_NS: "-5"}, b"x", None, "produce_ns_malformed"),
    ("produce_ns_huge", {PRODUCE_NS: "9" * 100_000}, b"x", None, "produce_ns_malformed"),
    ("produce_ns_zero", {PRODUCE_NS: "0"}, b"x", None, "produce_ns_out_of_range"),
    ("produce_ns_far_future", {PRODUCE_NS: str(NOW + 10**18)}, b"x", None, "produce_ns_out_of_range"),
    ("job_id_huge", {JOB_ID: "j" * 100_000}, b"x", None, "job_id_invalid"),
    ("job_id_control_chars", {JOB_ID: "a\x00b\x1b[31m"}, b"x", None, "job_id_invalid"),
    ("cost_nan", {COST: "nan"}, b"x", None, "cost_invalid"),
    ("cost_negative", {COST: "-1"}, b"x", None, "cost_invalid"),
    ("cost_huge", {COST: "1e400"}, b"x", None, "cost_invalid"),
    ("store_time_missing", {}, b"x", _set(store_timestamp=None), None),
    ("store_time_zero", {}, b"x", _set(store_timestamp=0), None),
    ("store_time_far_future", {}, b"x", _set(store_timestamp=10**15), "timestamp_out_of_range"),
    ("store_time_1970", {}, b"x", _set(store_timestamp=1), "timestamp_out_of_range"),
    ("store_time_overflow", {}, b"x", _set(store_timestamp=10**40), "timestamp_out_of_range"),
    ("store_time_not_a_number", {}, b"x", _set(store_timestamp="soon"), None),
    ("delivery_attempt_garbage", {}, b"x", _set(delivery_attempt=-7), None),
    ("properties_mapping_raises", {}, b"x", _props(RaisingMapping(a="b")), "unreadable"),
    ("attributes_raise", {}, b"x", HostileAttributes, None),
    ("body_empty", {}, b"", None, None),
    ("body_binary", {}, os.urandom(65536), None, None),
    ("body_nul_bytes", {}, b"\x00" * 1000, None, None),
    ("body_invalid_utf8", {}, b"\xc3\x28\xa0\xa1\xe2\x28\xa1", None, None),
    ("body_huge", {}, b"b" * 4_000_000, None, None),
    ("keys_and_tag_huge", {}, b"x", _set(tag="t" * 100_000, _keys=["k" * 100_000] * 50), None),
    ("hostile_unknown_properties", {"\x00": "\udcff", "k" * 1000: "v" * 100_000}, b"x", None, None),
]
REPEAT = 3  # messages per case: every kind must be counted each time and logged only once


class Mutating:
    """The embedded consumer, with each received message altered as its case says."""

    def __init__(self, consumer: SimpleConsumer) -> None:
        self.consumer = consumer
        self.mutations = {i: c[3] for i, c in enumerate(CASES)}

    def receive(self, n: int, invisible: float) -> list[Any]:
        out = []
        for m in self.consumer.receive(n, invisible):
            mutate = self.mutations[int(m.properties[CASE])]
            out.append(mutate(m) if mutate else m)
        return out

    def ack(self, m: Any) -> None:
        self.consumer.ack(m)

    def change_invisible_duration(self, m: Any, s: float) -> None:
        self.consumer.change_invisible_duration(m, s)


class ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def cases_run() -> dict[str, Any]:
    """Every case, REPEAT messages each, through one consume loop; every log record kept."""
    broker = EmbeddedBroker()
    broker.create_topic("T")
    producer = Producer(broker, ["T"])
    producer.startup()
    case_of: dict[str, str] = {}
    for i, (name, props, body, _, _) in enumerate(CASES):
        for _ in range(REPEAT):
            m = Message()
            m.topic, m.body = "T", body
            m.properties.update(props)  # as they come: bytes, ints, huge values
            m.properties[CASE] = str(i)
            case_of[producer.send(m).message_id] = name
    provider, collect, registry = TracerProvider(), Collect(), CollectorRegistry()
    provider.add_span_processor(collect)
    tracer = MessageTracer(consumer_group="G", tracer_provider=provider, metrics=TracerMetrics(registry))
    handled: Counter[str] = Counter()
    lock = threading.Lock()

    def handler(msg: Any) -> None:
        with lock:
            handled[case_of[msg.message_id]] += 1

    consumer = SimpleConsumer(broker, "G", {"T": None}, await_duration=0.05)
    consumer.startup()
    loop = ConsumeLoop(Mutating(consumer), handler, tracer=tracer, workers=4)
    total = len(CASES) * REPEAT
    logs, root = ListHandler(), logging.getLogger()
    level = root.level
    root.addHandler(logs)
    root.setLevel(logging.DEBUG)
    try:
        t = threading.Thread(target=loop.run, daemon=True)
        t.start()
        wait_until(lambda: loop.statistics().acked == total or not t.is_alive(), timeout=60,
                   what="every bad-input message acked")
        loop.stop()
        t.join(30)
    finally:
        root.removeHandler(logs)
        root.setLevel(level)
    return {"loop": loop, "tracer": tracer, "handled": handled, "spans": collect.spans, "registry": registry,
            "records": logs.records, "broker": broker, "thread_alive": t.is_alive()}


def test_every_bad_message_reaches_the_handler_once_and_is_acked(cases_run):
    loop = cases_run["loop"]
    assert not cases_run["thread_alive"], "the consume loop did not stop"
    assert cases_run["handled"] == Counter({c[0]: REPEAT for c in CASES})
    assert loop.statistics().failed == 0 and loop.statistics().acked == len(CASES) * REPEAT
    assert cases_run["broker"].backlog("G", "T") == 0
    assert not cases_run["tracer"].statistics().hook_failures, "the tracer's own code failed on some input"
    errors = [r for r in cases_run["records"] if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]


def test_every_bad_input_is_counted_by_kind_each_time(cases_run):
    expected: Counter[str] = Counter()
    for _, _, _, _, kind in CASES:
        if kind:
            expected[kind] += REPEAT
    counts = {k: v for k, v in cases_run["tracer"].errors.counts.items() if v}
    assert counts == dict(expected)
    reg = cases_run["registry"]
    for kind, n in expected.items():
        assert reg.get_sample_value("rmqtrace_propagation_errors_total", {"kind": kind}) == n


def test_each_kind_is_logged_once_and_nothing_logs_per_message(cases_run):
    warnings = [r for r in cases_run["records"] if r.levelno >= logging.WARNING]
    by_kind = Counter(r.args[0] for r in warnings if r.name == "tracer.path.propagation")
    assert by_kind == Counter({k: 1 for k in cases_run["tracer"].errors.counts if cases_run["tracer"].errors.counts[k]})
    others = [r for r in warnings if r.name != "tracer.path.propagation"]
    assert not others, [f"{r.name}: {r.getMessage()[:200]}" for r in others]
    # a logged hostile value is cut short
    assert all(len(r.getMessage()) < 300 for r in warnings)


def test_every_span_written_for_bad_input_can_be_exported(cases_run):
    spans = cases_run["spans"]
    process = [s for s in spans if s.name == "process T"]
    assert len(process) == len(CASES) * REPEAT
    encode_spans(spans)  # raises on what OTLP cannot carry (e.g. a time past 2**64 ns)
    for s in spans:
        assert 0 < s.start_time <= s.end_time < 2**63
        for value in (s.attributes or {}).values():
            assert len(value) <= 256 if isinstance(value, str) else True


def test_skew_bounds_are_not_poisoned_by_impossible_timestamps(cases_run):
    bounds = cases_run["tracer"].skew.bounds()
    assert all(abs(ns) < 24 * 3600 * 10**9 for ns in bounds.values()), bounds


# -- fuzzing ------------------------------------------------------------------------------------
RAN: Counter[str] = Counter()  # examples actually run, per fuzz test
FUZZ: dict[str, Any] = {"deadline": None, "database": None, "suppress_health_check": list(HealthCheck)}


@pytest.fixture(scope="module", autouse=True)
def _record_fuzz_counts():
    yield
    if RAN:
        record_figures("fuzz", {"examples_per_test": dict(RAN), "examples_total": sum(RAN.values())})


HEX = "0123456789abcdefABCDEF"
traceparents = st.one_of(
    st.text(max_size=120),
    st.text(alphabet=HEX + "-", max_size=70),
    st.builds(lambda t, s, f: f"00-{t:032x}-{s:016x}-{f:02x}", st.integers(0, 2**128 - 1), st.integers(0, 2**64 - 1),
              st.integers(0, 255)),
    st.builds(lambda v, t, s, f, extra: f"{v}-{t}-{s}-{f}{extra}",
              st.sampled_from(["00", "01", "ff", "fe", "0", "000"]),
              st.text(alphabet=HEX, min_size=30, max_size=34), st.text(alphabet=HEX, min_size=14, max_size=18),
              st.text(alphabet=HEX, min_size=1, max_size=3), st.sampled_from(["", "-x", "\n", " ", "-"])),
)


@settings(max_examples=2500, **FUZZ)
@given(traceparents, st.one_of(st.none(), st.text(max_size=80)))
def test_fuzz_parse_traceparent(value, tracestate):
    RAN["parse_traceparent"] += 1
    errors = PropagationErrors()
    sc = parse_traceparent(value, tracestate, errors)
    if sc is None:
        assert sum(errors.counts.values()) >= 1  # a rejection is always counted
    else:
        assert sc.is_valid and sc.is_remote
        # what we would propagate onwards is canonical version-00 W3C
        again = parse_traceparent(format_traceparent(sc), None, PropagationErrors())
        assert again is not None and (again.trace_id, again.span_id) == (sc.trace_id, sc.span_id)


tracestates = st.one_of(
    st.text(max_size=200),
    st.lists(st.tuples(st.text(alphabet="abcxyz019_-*/@", min_size=1, max_size=10),
                       st.text(alphabet=[chr(c) for c in range(0x20, 0x7F)], max_size=12)),
             max_size=40).map(lambda kv: ",".join(f"{k}={v}" for k, v in kv)),
)


@settings(max_examples=1500, **FUZZ)
@given(tracestates)
def test_fuzz_parse_tracestate_agrees_with_opentelemetry_and_never_warns(value):
    RAN["parse_tracestate"] += 1
    errors = PropagationErrors()
    logs, otel = ListHandler(), logging.getLogger("opentelemetry")
    otel.addHandler(logs)
    try:
        ours = parse_tracestate(value, errors)
    finally:
        otel.removeHandler(logs)
    assert not [r for r in logs.records if r.levelno >= logging.WARNING]
    if not errors.counts["tracestate_invalid"]:
        theirs = TraceState.from_header([value])
        assert list(ours.items()) == list(theirs.items())
    elif errors.counts["tracestate_invalid"]:
        assert len(ours) == 0


@settings(max_examples=1500, **FUZZ)
@given(st.one_of(st.text(max_size=40), st.integers(min_value=-10**30, max_value=10**30).map(str)))
def test_fuzz_parse_produce_ns(value):
    RAN["parse_produce_ns"] += 1
    errors = PropagationErrors()
    ns = parse_produce_ns(value, errors, NOW)
    assert ns == 0 or plausible_ns(ns, NOW)
    assert (ns != 0) == (sum(errors.counts.values()) == 0)


class Weird:
    def __str__(self) -> str:
        raise RuntimeError("str() of a property value raises")


values = st.one_of(st.text(max_size=100), st.binary(max_size=60), st.integers(), st.floats(), st.none(),
                   st.just(TP), st.builds(Weird), st.lists(st.text(max_size=5), max_size=3),
                   st.sampled_from([str(NOW), "0", "nan", "inf", "-0", "1e308", "\udcff", "\x00"]))
keys_ = st.sampled_from([TRACEPARENT, TRACESTATE, PRODUCE_NS, JOB_ID, COST, "other", ""])


@settings(max_examples=1500, **FUZZ)
@given(st.dictionaries(keys_, values, max_size=7), st.one_of(st.none(), values))
def test_fuzz_extract_with_hostile_values(props, system_ctx):
    RAN["extract"] += 1
    carried = extract(props, PropagationErrors(), NOW, system_trace_context=system_ctx)
    assert carried.produce_ns == 0 or plausible_ns(carried.produce_ns, NOW)
    assert carried.parent is None or carried.parent.is_valid
    assert carried.cost is None or 0.0 <= carried.cost < 1e15
    assert carried.job_id is None or (len(carried.job_id) <= 128 and carried.job_id.isprintable())


# what a client's message attributes can hold (objects whose str() raises appear only as property
# values above: ``describe`` assumes attributes convert to text)
anything = st.one_of(st.none(), st.text(max_size=30), st.binary(max_size=30), st.integers(), st.floats(),
                     st.lists(st.text(max_size=5), max_size=4),
                     st.dictionaries(st.text(max_size=10), st.text(max_size=10), max_size=3))
timestamps = st.one_of(st.none(), st.integers(min_value=-10**25, max_value=10**25),
                       st.integers(min_value=NOW // 10**6 - 10**8, max_value=NOW // 10**6 + 10**8),
                       st.text(max_size=5))
message_objects = st.builds(
    SimpleNamespace, topic=st.one_of(st.text(max_size=40), anything), message_id=anything, tag=anything,
    keys=anything, message_group=anything, properties=st.one_of(anything, st.dictionaries(keys_, values, max_size=5)),
    store_timestamp=timestamps, decode_message_timestamp=timestamps, delivery_attempt=anything,
    body=st.one_of(st.binary(max_size=100), st.text(max_size=50), st.none(), st.integers()),
    trace_context=st.one_of(st.none(), st.just(TP), st.text(max_size=60)),
)


@settings(max_examples=1000, **FUZZ)
@given(message_objects)
def test_fuzz_describe_never_raises(obj):
    RAN["describe"] += 1
    info = describe(obj)
    assert isinstance(info.topic, str) and isinstance(info.keys, tuple)
    assert info.store_ms is None or info.store_ms > 0


@settings(max_examples=500, **FUZZ)
@given(message_objects)
def test_describe_fast_path_reads_what_the_guarded_path_reads(obj):
    """describe reads plainly and falls back to a guard per attribute only when a property
    raises: both must give the same answer for every object both can read."""
    from tracer.path.message import _describe, _get, _plain_get

    assert _describe(obj, _plain_get) == _describe(obj, _get)


def test_describe_with_a_raising_property_keeps_the_other_fields():
    class Msg:
        topic = "orders"
        message_id = "m1"
        properties = {"a": "b"}

        @property
        def tag(self):
            raise RuntimeError("the client's property broke")

    info = describe(Msg())
    assert (info.topic, info.message_id, info.tag, dict(info.properties)) == ("orders", "m1", None, {"a": "b"})


_provider, _collect = TracerProvider(), Collect()
_provider.add_span_processor(_collect)
_registry = CollectorRegistry()
_tracer = MessageTracer(consumer_group="G", tracer_provider=_provider, metrics=TracerMetrics(_registry, label_limit=8))


@settings(max_examples=1500, **FUZZ)
@given(message_objects, st.one_of(st.none(), timestamps.filter(lambda t: isinstance(t, int))),
       st.sampled_from(list(Outcome)), st.booleans(), st.integers(min_value=0, max_value=64))
def test_fuzz_whole_message_path_never_raises_and_spans_export(obj, pulled, outcome, raise_in_handler, capture):
    RAN["message_path"] += 1
    failures = _tracer.statistics().hook_failures  # each example on its own: none added by this one
    _tracer.capture_body = capture
    _collect.spans.clear()
    info = describe(obj)
    trace = _tracer.start_message(info, pulled, getattr(obj, "body", None))
    trace.mark(Stage.DISPATCH_ENQUEUE)
    error = None
    try:
        with trace.handler_scope():
            if raise_in_handler:
                raise ValueError("user code failed")
    except ValueError as exc:
        error = exc
    trace.finish(outcome, error)
    assert _tracer.statistics().hook_failures == failures
    encode_spans(_collect.spans)
    body = next((s.attributes.get("rmqtrace.message.body") for s in _collect.spans if s.name.startswith("process")),
                None)
    if capture == 0:
        assert body is None
    elif body is not None:
        assert len(body.encode("utf-8")) <= 3 * capture
    assert _tracer.metrics.statistics().label_pairs <= (8 + 1) * 2


@settings(max_examples=1000, **FUZZ)
@given(st.one_of(st.binary(max_size=200), st.text(max_size=100)), st.integers(min_value=1, max_value=120))
def test_fuzz_body_preview(body, limit):
    RAN["body_preview"] += 1
    text = body_preview(body, limit)
    text.encode("utf-8")  # valid UTF-8 whatever the bytes were
    assert len(text) <= limit
