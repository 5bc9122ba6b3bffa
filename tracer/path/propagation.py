"""What travels inside a message: trace context, baggage and our produce stamp, as user properties.

Producers write the trace context through the global propagator (``OTEL_PROPAGATORS``; by default
W3C ``traceparent``/``tracestate`` and ``baggage`` — the keys the OpenTelemetry Java agent's
RocketMQ instrumentation uses as well, so Java producers join the same trace) with
:data:`SETTER`, and our own ``rmqtrace_produce_ns`` (plus job id and cost) beside it. Consumers
read them back through :func:`extract`. Properties come from other people's programs: anything
missing, malformed, oversized or not text is ignored and counted by kind — parsing never raises
into a producer or a handler.

Two extract paths, one result. When the global propagator is the SDK default (exactly the W3C
trace-context and baggage fields), ``traceparent``/``tracestate`` are parsed here: it is half
the cost of ``propagate.extract`` (2.0 µs against 3.3 µs for the context alone, timeit), counts
bad values by kind, and keeps the consumer's budget (BENCHMARKS.md). Baggage is then read by the
W3C baggage propagator only when the message carries a ``baggage`` property. Any other
propagator configuration is honoured through ``propagate.extract`` with :data:`GETTER`.

The consumer's tracer asks for the parse to be deferred (``extract(..., defer_parent=True)``,
then :func:`resolve`): a message for which no span is written and no context made current — a
no-op or absent SDK, metrics only — costs no traceparent parse (1.25 µs of its 6.7 µs), and a bad
traceparent or tracestate is counted when it is parsed, once, rather than on receipt.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any, Callable, Final, Mapping, NamedTuple

from opentelemetry import propagate, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter, Setter, TextMapPropagator
from opentelemetry.trace import SpanContext, TraceFlags, TraceState
from opentelemetry.trace.span import DEFAULT_TRACE_STATE

from .clock import WallNs
from .names import COST_PROPERTY, JOB_ID_PROPERTY, PRODUCE_NS_PROPERTY, TRACEPARENT, TRACESTATE

__all__ = [
    "BAGGAGE", "COST", "GETTER", "JOB_ID", "PLAUSIBLE_AHEAD_NS", "PLAUSIBLE_MIN_NS", "PRODUCE_NS", "SETTER",
    "TRACEPARENT", "TRACESTATE", "Carried",
    "PropagationErrors", "extract", "format_traceparent", "inject", "parse_produce_ns", "parse_traceparent",
    "parse_tracestate", "plausible_ns", "resolve", "resolve_parent", "span_context", "traceparent_sampled",
]

log = logging.getLogger(__name__)

# Property names (defined in .names; kept here under their old names for importers).
PRODUCE_NS: Final = PRODUCE_NS_PROPERTY
JOB_ID: Final = JOB_ID_PROPERTY
COST: Final = COST_PROPERTY
BAGGAGE: Final = "baggage"
# The fields of the SDK's default propagator (tracecontext,baggage): the hand path's condition.
_W3C_FIELDS: Final = frozenset((TRACEPARENT, TRACESTATE, BAGGAGE))
_BAGGAGE = W3CBaggagePropagator()

# Bounds on what we are willing to parse; beyond them the value is hostile or broken.
# Final: compiled (tracer.compiled), read from C statics, not the module's dict, on every message.
MAX_TRACESTATE_LEN: Final = 512
MAX_JOB_ID_LEN: Final = 128
_NS_MIN: Final = 946_684_800_000_000_000  # 2000-01-01: earlier is not a real produce time
_NS_FUTURE_SLACK: Final = 86_400_000_000_000  # a day
# plausible_ns's bounds, for callers that inline it on the message path
PLAUSIBLE_MIN_NS: Final = _NS_MIN
PLAUSIBLE_AHEAD_NS: Final = _NS_FUTURE_SLACK

_EMPTY_STATE: Final = TraceState()
_FLAGS: Final = (TraceFlags(0), TraceFlags(1))
_TRACEPARENT_RE: Final = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
# What every producer writes (version 00, lower case, nothing around it): matched without the
# copies strip() and lower() make; anything else takes the general path above.
_TRACEPARENT_00: Final = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]([0-9a-f])")
_ODD_HEX: Final = frozenset("13579bdf")  # the sampled bit is the low bit of the flags' last digit
_ZERO_TRACE_ID: Final = "0" * 32
_ZERO_SPAN_ID: Final = "0" * 16
# W3C tracestate list members (the grammar OpenTelemetry's TraceState checks), at most 32 of them
_TRACESTATE_MEMBER_RE: Final = re.compile(
    r"([a-z][_0-9a-z\-\*\/]{0,255}|[a-z0-9][_0-9a-z\-\*\/]{0,240}@[a-z][_0-9a-z\-\*\/]{0,13})"
    r"=([\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e])")
_TRACESTATE_MAX_MEMBERS: Final = 32


class PropagationErrors:
    """Counts bad properties by kind and logs the first of each kind once.

    ``on_count`` lets the metrics layer mirror the counts into Prometheus without this module
    knowing about it.
    """

    KINDS = (
        "traceparent_malformed",
        "traceparent_version",
        "traceparent_invalid_id",
        "tracestate_invalid",
        "produce_ns_malformed",
        "produce_ns_out_of_range",
        "job_id_invalid",
        "cost_invalid",
        "not_text",
        "inject_failed",
        "unreadable",
        "timestamp_out_of_range",  # a broker or client timestamp before 2000 or over a day ahead
    )

    def __init__(self, on_count: Callable[[str], None] | None = None) -> None:
        self._lock = threading.Lock()
        self.counts: dict[str, int] = {k: 0 for k in self.KINDS}
        self._on_count = on_count

    def count(self, kind: str, detail: str = "") -> None:
        with self._lock:
            first = self.counts.get(kind, 0) == 0
            self.counts[kind] = self.counts.get(kind, 0) + 1
        if first:
            log.warning("rmqtrace: ignoring bad message property (%s)%s; further ones are only counted",
                        kind, f": {detail[:80]!r}" if detail else "")
        if self._on_count is not None:
            try:
                self._on_count(kind)
            except Exception:  # noqa: BLE001 - a metrics hook must not break parsing
                log.debug("propagation error hook failed", exc_info=True)


class Carried(NamedTuple):
    """What :func:`extract` found in a message's properties (a NamedTuple: one per message)."""

    parent: SpanContext | None = None  # the producer's span context (remote), or None
    produce_ns: int = 0
    job_id: str | None = None
    cost: float | None = None
    # The extracted context when it holds more than ``parent`` (baggage, or what another
    # propagator put there); None on the common path, where a Context is built only if needed.
    context: Context | None = None
    # With ``extract(..., defer_parent=True)``: the raw traceparent/tracestate, not parsed yet
    # (``parent`` is None until :func:`resolve`); None once parsed or when there was none.
    traceparent: str | None = None
    tracestate: str | None = None


_new_tuple: Final = tuple.__new__


class _PropertyGetter(Getter[Mapping[str, Any]]):
    """Reads message properties for a propagator: text values only, bytes decoded."""

    def get(self, carrier: Mapping[str, Any], key: str) -> list[str] | None:
        try:
            value = carrier.get(key)
        except Exception:  # noqa: BLE001 - a foreign mapping
            return None
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError:
                return None
        return [value] if isinstance(value, str) else None

    def keys(self, carrier: Mapping[str, Any]) -> list[str]:
        try:
            return [k for k in carrier.keys() if isinstance(k, str)]
        except Exception:  # noqa: BLE001
            return []


class _PropertySetter(Setter[Callable[[str, str], object]]):
    """Writes through a message's ``set_property(key, value)`` (the carrier is that callable)."""

    def set(self, carrier: Callable[[str, str], object], key: str, value: str) -> None:
        carrier(key, value)


GETTER = _PropertyGetter()
SETTER = _PropertySetter()


class _PathChoice:
    """Whether the global propagator is the W3C default, decided once per propagator object."""

    __slots__ = ("propagator", "w3c")

    def __init__(self) -> None:
        self.propagator: TextMapPropagator | None = None
        self.w3c = True

    def hand_path(self) -> tuple[bool, TextMapPropagator]:
        current = propagate.get_global_textmap()
        if current is not self.propagator:
            try:
                self.w3c = frozenset(current.fields) <= _W3C_FIELDS
            except Exception:  # noqa: BLE001 - a broken propagator: use it, it may still extract
                self.w3c = False
            self.propagator = current
        return self.w3c, current


_choice: Final = _PathChoice()


def _text(value: Any, errors: PropagationErrors) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            errors.count("not_text", repr(value[:40]))
            return None
    errors.count("not_text", type(value).__name__)
    return None


_TRACE_ID_MAX: Final = (1 << 128) - 1
_SPAN_ID_MAX: Final = (1 << 64) - 1
_SPAN_CONTEXT: Final = SpanContext  # C statics when compiled (tracer.compiled)
_DEFAULT_STATE: Final = DEFAULT_TRACE_STATE


def span_context(trace_id: int, span_id: int, is_remote: bool, flags: TraceFlags,
                 state: TraceState | None) -> SpanContext:
    """``SpanContext(trace_id, span_id, is_remote, flags, state)``: the same tuple (validity
    included), built without the class call's ``__new__`` dispatch and defaults; a traced message
    builds up to five (docs/benchmarks-history.md, "Session 8")."""
    return _new_tuple(_SPAN_CONTEXT, (trace_id, span_id, is_remote, flags,
                                      _DEFAULT_STATE if state is None else state,
                                      0 < trace_id <= _TRACE_ID_MAX and 0 < span_id <= _SPAN_ID_MAX))


def parse_traceparent(value: str, tracestate: str | None, errors: PropagationErrors) -> SpanContext | None:
    """A W3C traceparent into a remote span context; None (counted) when not valid."""
    m = _TRACEPARENT_00.fullmatch(value) if len(value) == 55 else None
    if m is not None:
        trace_id_hex, span_id_hex, flags_low = m.groups()
        trace_id, span_id = int(trace_id_hex, 16), int(span_id_hex, 16)
        if trace_id and span_id:
            state = parse_tracestate(tracestate, errors) if tracestate else _EMPTY_STATE
            return span_context(trace_id, span_id, True, _FLAGS[flags_low in _ODD_HEX], state)
    if len(value) > 256:
        errors.count("traceparent_malformed", value[:40])
        return None
    m = _TRACEPARENT_RE.match(value.strip().lower())
    if m is None:
        errors.count("traceparent_malformed", value)
        return None
    version, trace_id_hex, span_id_hex, flags_hex, rest = m.groups()
    # Version ff is forbidden; version 00 has exactly four fields; later versions may add fields.
    if version == "ff" or (version == "00" and rest):
        errors.count("traceparent_version", value)
        return None
    trace_id, span_id = int(trace_id_hex, 16), int(span_id_hex, 16)
    if trace_id == 0 or span_id == 0:
        errors.count("traceparent_invalid_id", value)
        return None
    state = parse_tracestate(tracestate, errors) if tracestate else _EMPTY_STATE
    return span_context(trace_id, span_id, True, _FLAGS[int(flags_hex, 16) & 0x01], state)


def traceparent_sampled(value: str) -> bool | None:
    """The sampled flag of a canonical version-00 traceparent with nonzero ids (what
    :func:`parse_traceparent` would accept without counting an error, the tracestate aside),
    read without building its context; None for any other value (parse it to know)."""
    m = _TRACEPARENT_00.fullmatch(value) if len(value) == 55 else None
    if m is None:
        return None
    trace_id_hex, span_id_hex, flags_low = m.groups()
    if trace_id_hex == _ZERO_TRACE_ID or span_id_hex == _ZERO_SPAN_ID:
        return None
    return flags_low in _ODD_HEX


def parse_tracestate(value: str, errors: PropagationErrors) -> TraceState:
    """A W3C tracestate; empty (counted) when any member is invalid, as the spec asks.

    Checked here rather than by ``TraceState.from_header``, which logs a warning with the
    offending value for every message that carries one.
    """
    if len(value) > MAX_TRACESTATE_LEN:
        errors.count("tracestate_invalid", value[:40])
        return _EMPTY_STATE
    pairs: dict[str, str] = {}
    for member in value.split(","):
        member = member.strip(" \t")
        if not member:
            continue  # empty members are allowed
        m = _TRACESTATE_MEMBER_RE.fullmatch(member)
        if m is None or m.group(1) in pairs or len(pairs) >= _TRACESTATE_MAX_MEMBERS:
            errors.count("tracestate_invalid", value)
            return _EMPTY_STATE
        pairs[m.group(1)] = m.group(2)
    return TraceState(list(pairs.items()))


def plausible_ns(ns: int, now_ns: WallNs) -> bool:
    """A wall-clock time that can be a real stamp: after 2000 and at most a day ahead of ``now_ns``.

    Anything else would poison the skew bounds and make spans the OTLP encoder rejects (its
    times are unsigned 64-bit), losing the whole export batch they travel in.
    """
    return _NS_MIN <= ns <= now_ns + _NS_FUTURE_SLACK


def parse_produce_ns(value: str, errors: PropagationErrors, now_ns: WallNs) -> int:
    if not value.isascii() or not value.isdigit() or len(value) > 20:
        errors.count("produce_ns_malformed", value)
        return 0
    ns = int(value)
    if not _NS_MIN <= ns <= now_ns + _NS_FUTURE_SLACK:  # plausible_ns, inline: once a message
        errors.count("produce_ns_out_of_range", value)
        return 0
    return ns


def extract(properties: Mapping[str, Any] | None, errors: PropagationErrors, now_ns: WallNs,
            system_trace_context: Any = None, *, defer_parent: bool = False) -> Carried:
    """Read what a producer carried. Never raises.

    ``system_trace_context`` is a traceparent carried outside user properties (the Java gRPC
    client's ``trace_context`` system property); user properties win when both exist.

    ``defer_parent=True`` leaves the W3C traceparent/tracestate unparsed in the result (when
    nothing else needs them now: no baggage, the default propagator), for :func:`resolve` to
    parse if a span is ever written — a message only measured costs no parse, and a bad value
    is counted when (and only if) it is parsed.
    """
    try:
        return _extract(properties or {}, errors, now_ns, system_trace_context, defer_parent)
    except Exception as exc:  # noqa: BLE001 - e.g. a Mapping whose .get raises
        errors.count("unreadable", repr(exc))
        return Carried()


def resolve_parent(carried: Carried, errors: PropagationErrors) -> SpanContext | None:
    """``carried.parent``, a deferred traceparent parsed first (bad values counted on each call). Never raises."""
    tp = carried.traceparent
    if tp is None:
        return carried.parent
    try:
        return parse_traceparent(tp, carried.tracestate, errors)
    except Exception as exc:  # noqa: BLE001 - never into a handler
        errors.count("unreadable", repr(exc))
        return None


def resolve(carried: Carried, errors: PropagationErrors) -> Carried:
    """``carried`` with a deferred traceparent parsed into ``parent`` (bad values counted). Never raises."""
    if carried.traceparent is None:
        return carried
    # built directly: NamedTuple._replace costs about as much as the parse
    return Carried(resolve_parent(carried, errors), carried.produce_ns, carried.job_id, carried.cost,
                   carried.context)


def _extract(props: Mapping[str, Any], errors: PropagationErrors, now_ns: WallNs,
             system_trace_context: Any, defer_parent: bool = False) -> Carried:
    parent = None
    context: Context | None = None
    raw_tp = raw_ts = None
    w3c, propagator = _choice.hand_path()
    get = props.get
    if w3c:
        tp = get(TRACEPARENT)
        if tp.__class__ is not str:  # str is what every client gives: checked first, inline
            tp = _text(tp, errors)
            if tp is None:
                tp = _text(system_trace_context, errors)
        has_baggage = BAGGAGE in props
        if tp:
            ts = get(TRACESTATE)
            if ts is not None and ts.__class__ is not str:
                ts = _text(ts, errors)
            if defer_parent and not has_baggage:
                raw_tp, raw_ts = tp, ts
            else:
                parent = parse_traceparent(tp, ts, errors)
        if has_baggage:
            context = _with_baggage(props, parent)
    else:
        parent, context = _extract_configured(propagator, props, errors, system_trace_context)

    produce_ns = 0
    raw = get(PRODUCE_NS)
    if raw is not None:
        if raw.__class__ is not str:
            raw = _text(raw, errors)
        if raw is not None:
            produce_ns = parse_produce_ns(raw, errors, now_ns)

    job_id = get(JOB_ID)
    if job_id is not None:
        if job_id.__class__ is not str:
            job_id = _text(job_id, errors)
        if job_id is not None and (not job_id or len(job_id) > MAX_JOB_ID_LEN or not job_id.isprintable()):
            errors.count("job_id_invalid", job_id[:40])
            job_id = None

    cost = None
    raw_cost = get(COST)
    if raw_cost is not None and raw_cost.__class__ is not str:
        raw_cost = _text(raw_cost, errors)
    if raw_cost is not None:
        try:
            cost = float(raw_cost) if len(raw_cost) <= 32 else None
        except ValueError:
            cost = None
        if cost is None or not (0.0 <= cost < 1e15):
            errors.count("cost_invalid", raw_cost)
            cost = None
    # tuple.__new__ is what the NamedTuple's own __new__ calls, one Python frame less per message
    return _new_tuple(Carried, (parent, produce_ns, job_id, cost, context, raw_tp, raw_ts))


def _extract_configured(propagator: Any, props: Mapping[str, Any], errors: PropagationErrors,
                        system_trace_context: Any) -> tuple[SpanContext | None, Context]:
    """The parent and context through the configured propagator (not plain W3C), the 5.x system
    trace context when it finds none."""
    context = propagator.extract(props, Context(), getter=GETTER)
    found = trace.get_current_span(context).get_span_context()
    if found.is_valid:
        return found, context
    parent = None
    tp = _text(system_trace_context, errors)
    if tp:
        parent = parse_traceparent(tp, None, errors)
        if parent is not None:
            context = trace.set_span_in_context(trace.NonRecordingSpan(parent), context)
    return parent, context


def _with_baggage(props: Mapping[str, Any], parent: SpanContext | None) -> Context | None:
    base = trace.set_span_in_context(trace.NonRecordingSpan(parent), Context()) if parent is not None else Context()
    ctx = _BAGGAGE.extract(props, base, getter=GETTER)
    return ctx if ctx is not base else None


def inject(set_property: Callable[[str, str], object], produce_ns: int, ctx: Context | None = None,
           job_id: str | None = None, cost: float | None = None) -> None:
    """Write trace context, baggage and stamps through ``set_property(key, value)``.

    The trace context is the span current in ``ctx`` (or the current context): callers make the
    producer span current first. It goes through the global propagator, so ``OTEL_PROPAGATORS``
    and baggage apply as in any other instrumentation; the produce stamp is ours and always written.
    """
    propagate.inject(set_property, ctx, setter=SETTER)
    set_property(PRODUCE_NS, str(produce_ns))
    if job_id is not None:
        set_property(JOB_ID, job_id)
    if cost is not None:
        set_property(COST, repr(float(cost)))


def format_traceparent(span_context: SpanContext) -> str:
    return f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-{int(span_context.trace_flags) & 0x01:02x}"
