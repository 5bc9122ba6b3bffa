"""Where spans come from: the embedded mode's JSON-lines file, or a Jaeger query service.

Both yield :class:`~tracer.spanfile.SpanRecord`. The Jaeger reader speaks the HTTP JSON API the
Jaeger UI uses (``/api/traces``), with the standard library only. For reading a whole fleet there
is also :func:`find_traces_v3`: Jaeger's ``api_v3`` gRPC query service, which streams OTLP
protobuf one trace at a time (see BENCHMARKS.md, "bench report", for why it is the fast path).

Precision: stamps are ns since the epoch (~1.8e18), beyond the 2^53 a double holds exactly.
Jaeger (v1.76, ``/api/traces``) keeps ``int64`` tags as integers and writes those beyond 2^53 as
JSON *strings* (``"value": "1795979586780817535"``) and small ones as numbers; both are read back
as exact ints, so the stamps survive the trip (checked against a real Jaeger in
``tests/test_report_jaeger.py``). A tag that arrives as a float (a proxy or store that went
through doubles) is kept as a float; the model then rebuilds that message's timing from span
times instead (µs resolution) and the report counts such messages.
"""

from __future__ import annotations

import contextlib
import gc
import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TypeVar

from ..telemetry.spanfile import SpanRecord, read_spans

DEFAULT_JAEGER = "http://127.0.0.1:16686"
DEFAULT_SERVICE = "rmqtrace"


class SourceError(Exception):
    """The spans could not be read; the message says why and what to try."""


class NoTracesForService(SourceError):
    """Jaeger has no traces of the service asked for; ``consumer_services`` are the ones that have
    rmqtrace consumer spans (a ``process {topic}`` span with its ``handler`` child)."""

    def __init__(self, message: str, service: str, consumer_services: list[str]) -> None:
        super().__init__(message)
        self.service = service
        self.consumer_services = consumer_services


T = TypeVar("T")


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic garbage collector off while a reader builds its objects, as it was afterwards.

    Parsing spans allocates millions of objects and no cycles; every allocation burst triggers a
    collection that walks all that was parsed so far: 43 % of reading a 10⁵-message span file
    (9.1 s → 5.2 s, BENCHMARKS.md "bench report"). Afterwards every tracked object — what was made
    meanwhile, and whatever was still young from before — is handed to the oldest generation
    (``freeze`` then ``unfreeze``: two list splices), not left in the youngest, whose first
    collections after the pause would walk all of it again (0.3–0.8 s after reading 10⁴ messages,
    0.17 s for the one full collection instead). Nothing to collect is missed: a cycle among them
    is collected by the next full collection, only later than a young one would have.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.freeze()
            gc.unfreeze()
            gc.enable()


# -- JSON lines ------------------------------------------------------------------------------
def read_span_path(path: str | Path, read: Callable[[Path], T]) -> T:
    """``read(path)`` of a JSON-lines span file, with the collector paused; a missing file, a
    folder or a read error is one :class:`SourceError`."""
    p = Path(path)
    if not p.exists():
        raise SourceError(f"no spans file at {p} (run `rmqtrace demo` or point RMQTRACE_SPANS_FILE at one)")
    if p.is_dir():
        raise SourceError(f"{p} is a directory; give the spans.jsonl file inside it")
    try:
        with paused_gc():
            return read(p)
    except OSError as exc:
        raise SourceError(f"cannot read {p}: {exc}") from exc


def read_jsonl(path: str | Path) -> list[SpanRecord]:
    return read_span_path(path, lambda p: list(read_spans(p)))


def read_jsonl_counted(path: str | Path) -> tuple[list[SpanRecord], int, int]:
    """The spans of a JSON-lines file, its non-blank lines, and how many of those were not spans."""
    spans = read_jsonl(path)
    try:
        with Path(path).open(encoding="utf-8", errors="replace") as fh:
            lines = sum(1 for line in fh if line.strip())
    except OSError as exc:
        raise SourceError(f"cannot read {path}: {exc}") from exc
    return spans, lines, max(0, lines - len(spans))


# -- Jaeger ----------------------------------------------------------------------------------
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(text: str) -> float:
    """``90s``, ``15m``, ``1h``, ``2d``, ``500ms`` or plain seconds → seconds."""
    m = _DURATION.match(text or "")
    if not m:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30m, 1h, 2d)")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def _tag_value(tag: dict[str, Any]) -> Any:
    """A Jaeger tag's value as the attribute the SDK wrote. int64 stays an exact int."""
    kind = str(tag.get("type", "string")).lower()
    v = tag.get("value")
    if kind == "int64":
        if isinstance(v, bool):
            return int(v)
        if isinstance(v, int):
            return v
        if isinstance(v, str):
            try:
                return int(v)
            except ValueError:
                return v
        return v  # a float: precision may be gone; the model will not trust it as a stamp
    if kind == "float64":
        try:
            return float(v)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return v
    if kind == "bool":
        return v if isinstance(v, bool) else str(v).lower() == "true"
    if kind == "string" and isinstance(v, str) and v[:1] == "[" and v[-1:] == "]":
        try:  # OTLP array attributes arrive as their JSON text
            parsed = json.loads(v)
            if isinstance(parsed, list):
                return parsed
        except ValueError:
            pass
    return v


_SKIP_TAGS = {"span.kind", "otel.status_code", "otel.status_description", "otel.scope.name",
              "otel.scope.version", "otel.library.name", "otel.library.version", "internal.span.format", "error"}


def _hex(value: Any, width: int) -> str:
    return str(value or "").lower().rjust(width, "0")


def _parent_of(span: dict[str, Any]) -> str | None:
    """The parent span id: the CHILD_OF reference, else a FOLLOWS_FROM one in the same trace.

    Jaeger folds a span's link to its own parent into the parent reference and then reports it as
    FOLLOWS_FROM (``process`` links to the ``send`` it is a child of); a FOLLOWS_FROM reference
    into another trace is a plain link, never a parent.
    """
    refs = [r for r in span.get("references") or () if r.get("spanID")]
    for ref in refs:
        if ref.get("refType", "CHILD_OF") == "CHILD_OF":
            return _hex(ref["spanID"], 16)
    trace_id = _hex(span.get("traceID"), 32)
    for ref in refs:
        if _hex(ref.get("traceID") or span.get("traceID"), 32) == trace_id:
            return _hex(ref["spanID"], 16)
    if span.get("parentSpanID"):
        return _hex(span["parentSpanID"], 16)
    return None


INSTANCE_KEY = "service.instance.id"


def jaeger_instance(process: dict[str, Any]) -> str:
    """The consumer instance a Jaeger process (a span's resource) names: ``service.instance.id``,
    else its host, else its service."""
    tags = {t.get("key"): t.get("value") for t in process.get("tags") or ()}
    return str(tags.get(INSTANCE_KEY) or tags.get("hostname") or process.get("serviceName") or "?")


def jaeger_span(span: dict[str, Any], processes: dict[str, Any]) -> SpanRecord:
    """One span of Jaeger's JSON (``/api/traces``) as a :class:`SpanRecord` (µs → ns)."""
    tags = {str(t.get("key")): t for t in span.get("tags") or ()}
    parent = _parent_of(span)
    kind = str(tags["span.kind"].get("value")).upper() if "span.kind" in tags else "INTERNAL"
    status = "UNSET"
    if "otel.status_code" in tags:
        status = str(tags["otel.status_code"].get("value")).upper()
    elif tags.get("error", {}).get("value") in (True, "true"):
        status = "ERROR"
    start_us = int(span.get("startTime") or 0)
    duration_us = int(span.get("duration") or 0)
    proc = processes.get(str(span.get("processID")), {}) if processes else {}
    return SpanRecord(
        trace_id=_hex(span.get("traceID"), 32), span_id=_hex(span.get("spanID"), 16), parent_span_id=parent,
        name=str(span.get("operationName", "")), kind=kind, start_ns=start_us * 1000,
        end_ns=(start_us + duration_us) * 1000, status=status, service=proc.get("serviceName"),
        attributes={k: _tag_value(t) for k, t in tags.items() if k not in _SKIP_TAGS},
        instance=jaeger_instance(proc) if proc else None,
    )


def spans_from_jaeger_json(payload: dict[str, Any]) -> Iterator[SpanRecord]:
    """Spans of every trace in a ``/api/traces`` (or ``/api/traces/{id}``) response."""
    errors = payload.get("errors")
    if errors and not payload.get("data"):
        raise SourceError(f"Jaeger answered with errors: {errors}")
    for trace in payload.get("data") or ():
        processes = trace.get("processes") or {}
        for span in trace.get("spans") or ():
            yield jaeger_span(span, processes)


def _get_json(url: str, timeout: float) -> dict[str, Any]:
    req = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - the user's own Jaeger
            body = resp.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:300].decode("utf-8", "replace")
        raise SourceError(f"Jaeger at {url} answered HTTP {exc.code}: {detail}") from exc
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise SourceError(f"cannot reach Jaeger at {url}: {reason} (is it running? "
                          "`services/jaeger/jaeger.sh start` starts a local one)") from exc
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise SourceError(f"Jaeger at {url} did not answer JSON: {body[:200]!r}") from exc
    if not isinstance(data, dict):
        raise SourceError(f"unexpected answer from {url}: {str(data)[:200]}")
    return data


def read_jaeger(base_url: str = DEFAULT_JAEGER, service: str = DEFAULT_SERVICE, *, limit: int = 2000,
                lookback_s: float = 3600.0, timeout: float = 30.0, now_s: float | None = None) -> list[SpanRecord]:
    """The message traces (those with a ``process`` span) of ``service`` from the last
    ``lookback_s`` seconds, at most ``limit`` of them."""
    base = base_url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise SourceError(f"--jaeger wants an http(s) URL like {DEFAULT_JAEGER}, got {base_url!r}")
    from ..path import names as n

    end_us = int((time.time() if now_s is None else now_s) * 1e6)
    # only traces with a process span, so `limit` counts messages: each receive call is a trace of
    # its own (142 of them for 200 messages), and --limit 100 found no message at all (issue 33)
    query = urllib.parse.urlencode({"service": service, "limit": limit,
                                    "start": end_us - int(lookback_s * 1e6), "end": end_us,
                                    "tags": json.dumps({n.OPERATION_TYPE: n.PROCESS})})
    payload = _get_json(f"{base}/api/traces?{query}", timeout)
    with paused_gc():
        spans = list(spans_from_jaeger_json(payload))
    if not spans:
        services = sorted(_get_json(f"{base}/api/services", timeout).get("data") or [])
        consumers = consumer_services(base, services, timeout)
        if consumers:  # without OTEL_SERVICE_NAME the SDK names it unknown_service:python (issue 33)
            hint = f"services with rmqtrace consumer spans: {', '.join(consumers)}; give --service NAME"
        elif services:
            hint = f"no service has rmqtrace consumer spans; services known: {', '.join(services)}"
        else:
            hint = "Jaeger knows no services yet"
        raise NoTracesForService(f"no traces for service {service!r} in the last {lookback_s:g} s at {base} ({hint})",
                                 service, consumers)
    return spans


MAX_SERVICES_ASKED = 200  # one operations query per service: bounded on a Jaeger shared by many teams


def consumer_services(base_url: str, services: list[str], timeout: float = 30.0) -> list[str]:
    """Which of ``services`` have rmqtrace consumer spans in Jaeger (by their operation names:
    ``process {topic}`` and ``handler``); the first :data:`MAX_SERVICES_ASKED` are asked."""
    from ..path import names as n

    base = base_url.rstrip("/")
    found = []
    for service in services[:MAX_SERVICES_ASKED]:
        quoted = urllib.parse.quote(service, safe="")
        ops = _get_json(f"{base}/api/services/{quoted}/operations", timeout).get("data") or []
        if n.HANDLER_SPAN in ops and any(str(o).startswith(n.process_span_name("")) for o in ops):
            found.append(service)
    return found


def read_jaeger_trace(base_url: str, trace_id: str, *, timeout: float = 30.0) -> list[SpanRecord]:
    return list(spans_from_jaeger_json(_get_json(f"{base_url.rstrip('/')}/api/traces/{trace_id}", timeout)))


# -- Jaeger api_v3 (gRPC, OTLP protobuf, streamed) ----------------------------------------------
V3_FIND_TRACES = "/jaeger.api_v3.QueryService/FindTraces"
DEFAULT_V3_PORT = 16685  # jaeger_query's default gRPC endpoint …
DEFAULT_HTTP_PORT = 16686  # … beside its default HTTP one


class SearchDepthTooLarge(SourceError):
    """The store refused the search depth (Jaeger's memory store: more than its ``max_traces``)."""


def v3_target(base_url: str, grpc_target: str | None = None) -> str | None:
    """``host:port`` of the api_v3 gRPC service: ``grpc_target`` if given; else, when ``base_url``
    is on Jaeger's default HTTP port 16686, the same host on its default gRPC port 16685; else
    None (a Jaeger moved to other ports says nothing of where its gRPC went)."""
    if grpc_target:
        return grpc_target
    url = urllib.parse.urlsplit(base_url)
    if url.port != DEFAULT_HTTP_PORT:
        return None
    host = url.hostname or "127.0.0.1"
    return f"[{host}]:{DEFAULT_V3_PORT}" if ":" in host else f"{host}:{DEFAULT_V3_PORT}"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | 0x80 if n else b)
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:  # wire type 2: length-delimited
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _timestamp(ns: int) -> bytes:  # google.protobuf.Timestamp {1: seconds, 2: nanos}
    seconds, nanos = divmod(ns, 1_000_000_000)
    return _varint(1 << 3) + _varint(seconds) + (_varint(2 << 3) + _varint(nanos) if nanos else b"")


def find_traces_request(service: str, start_ns: int, end_ns: int, depth: int, *, raw: bool = False) -> bytes:
    """``api_v3.FindTracesRequest`` as protobuf bytes. Hand-encoded (five fields) so that no
    generated Jaeger stubs are needed; field numbers from jaeger-idl ``api_v3/query_service.proto``:
    TraceQueryParameters {1 service_name, 4 start_time_min, 5 start_time_max, 8 search_depth,
    9 raw_traces}, FindTracesRequest {1 query}."""
    if depth < 1:
        raise ValueError(f"search depth must be >= 1, got {depth}")
    query = (_field(1, service.encode()) + _field(4, _timestamp(start_ns)) + _field(5, _timestamp(end_ns))
             + _varint(8 << 3) + _varint(depth) + (_varint(9 << 3) + _varint(1) if raw else b""))
    return _field(1, query)


def find_traces_v3(target: str, service: str, start_ns: int, end_ns: int, *, depth: int,
                   timeout: float = 30.0, raw: bool = False) -> Iterator[Any]:
    """Stream ``opentelemetry.proto.trace.v1.TracesData`` messages (Jaeger sends one per trace)
    for the traces of ``service`` with a span starting in [start, end], at most ``depth`` traces.
    ``raw=False`` runs Jaeger's adjusters (clock skew, span de-duplication, attribute sorting …) on
    every trace, as ``/api/traces`` always does; ``raw=True`` skips them (most of Jaeger's CPU time
    for a large read).

    Needs ``grpcio`` (the ``grpc`` or ``rocketmq`` extra). Raises :class:`SourceError` (and
    :class:`SearchDepthTooLarge` when the store refuses ``depth``); ImportError without grpcio.
    """
    import grpc  # type: ignore[import-untyped]
    import grpc.experimental  # type: ignore[import-untyped]
    from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

    request = find_traces_request(service, start_ns, end_ns, depth, raw=raw)
    # Single-threaded streaming: each message is read on the caller's thread instead of being
    # handed over from the channel's spin thread (a wake-up per trace; half the read in profiles).
    options = [(grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1)]
    with grpc.insecure_channel(target, options=options) as channel:
        call = channel.unary_stream(V3_FIND_TRACES, request_serializer=None,
                                    response_deserializer=TracesData.FromString)
        try:
            yield from call(request, timeout=timeout)
        except grpc.RpcError as exc:
            code, detail = exc.code(), exc.details() or ""  # type: ignore[attr-defined]
            if "search depth" in detail:
                raise SearchDepthTooLarge(f"Jaeger at {target} refused search depth {depth}: {detail}") from exc
            if code == grpc.StatusCode.UNAVAILABLE:
                raise SourceError(f"cannot reach Jaeger's api_v3 gRPC service at {target}: {detail}") from exc
            raise SourceError(f"Jaeger api_v3 at {target} answered {code.name}: {detail}") from exc


def any_value(v: Any) -> Any:
    """An OTLP ``AnyValue`` as the attribute the SDK wrote (int64 stays an exact int)."""
    kind = v.WhichOneof("value")
    if kind == "string_value":
        return v.string_value
    if kind == "int_value":
        return v.int_value
    if kind == "bool_value":
        return v.bool_value
    if kind == "double_value":
        return v.double_value
    if kind == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if kind == "bytes_value":
        return v.bytes_value
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in v.kvlist_value.values}
    return None


def count_processes(spans: Iterable[SpanRecord]) -> int:
    from .records import is_process_span
    return sum(1 for s in spans if is_process_span(s))


__all__ = ["DEFAULT_JAEGER", "DEFAULT_SERVICE", "DEFAULT_V3_PORT", "INSTANCE_KEY", "MAX_SERVICES_ASKED",
           "NoTracesForService", "jaeger_instance",
           "SearchDepthTooLarge", "SourceError", "any_value", "consumer_services", "count_processes",
           "find_traces_request", "find_traces_v3", "jaeger_span", "parse_duration", "paused_gc", "read_jaeger",
           "read_jaeger_trace", "read_jsonl", "read_jsonl_counted", "read_span_path", "spans_from_jaeger_json",
           "v3_target"]
