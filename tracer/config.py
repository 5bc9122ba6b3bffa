"""Settings from the environment, read at entry points (never at import), and SDK setup.

Standard ``OTEL_*`` variables keep the meaning the SDK's environment specification gives them:
``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` (``service.name=...``; with neither, the
SDK's ``unknown_service:<executable>``), ``OTEL_EXPORTER_OTLP_ENDPOINT`` /
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (unset: the SDK default, ``http://localhost:4318`` for
``http/protobuf``, ``http://localhost:4317`` for ``grpc``), ``OTEL_EXPORTER_OTLP_PROTOCOL``,
``OTEL_TRACES_EXPORTER`` (a list of ``otlp``, ``console``, ``none``; default ``otlp``),
``OTEL_TRACES_SAMPLER``/``_ARG`` (read by the SDK itself) and ``OTEL_SDK_DISABLED``. A value rmqtrace
cannot honour is an error, not a silent fallback. rmqtrace adds a few ``RMQTRACE_*`` ones, listed on
:class:`Settings`.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence
from urllib.parse import unquote

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from .environ import environment
from .telemetry.adopt import install, keep_for
from .telemetry.hold import HoldingSpanProcessor
from .telemetry.keep import KeepPolicy
from .telemetry.metrics import TracerMetrics, multiprocess_dir
from .telemetry.tracerconfig import keep_variables

__all__ = [
    "EXPORTERS", "PROTOCOLS", "CountingExporter", "CountingSpanProcessor", "DropCounter", "Settings", "SpanQueueStats",
    "child_exporters", "configure_tracing", "default_instance_id", "exporter_endpoint", "make_exporters", "serve_metrics",
]

log = logging.getLogger(__name__)

EXPORTERS = ("otlp", "console", "none")  # the OTEL_TRACES_EXPORTER values rmqtrace can build
PROTOCOLS = ("http/protobuf", "grpc")  # the OTLP protocols of the installed exporters


@dataclass(frozen=True)
class Settings:
    """What :func:`configure_tracing` and :func:`serve_metrics` build; ``from_env`` reads it.

    ``service_name=None`` leaves ``service.name`` to the SDK's resource detection;
    ``traces_exporter=None`` means ``OTEL_TRACES_EXPORTER`` is unset: the span file when
    ``RMQTRACE_SPANS_FILE`` is set and no OTLP endpoint is, else OTLP (the SDK's default).
    """

    service_name: str | None = None  # OTEL_SERVICE_NAME, else service.name in OTEL_RESOURCE_ATTRIBUTES
    otlp_endpoint: str | None = None  # OTEL_EXPORTER_OTLP[_TRACES]_ENDPOINT (None: the SDK default)
    otlp_protocol: str = "http/protobuf"  # OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL
    traces_exporter: str | None = None  # OTEL_TRACES_EXPORTER, normalised ("otlp,console")
    sdk_disabled: bool = False  # OTEL_SDK_DISABLED
    spans_file: str | None = None  # RMQTRACE_SPANS_FILE: JSON-lines span file
    metrics_port: int | None = None  # RMQTRACE_METRICS_PORT: serve /metrics
    metrics_addr: str = "127.0.0.1"  # RMQTRACE_METRICS_ADDR: loopback unless told otherwise
    consumer_group: str = ""  # RMQTRACE_CONSUMER_GROUP: label for wrapped push consumers
    # RMQTRACE_INSTANCE_ID, else service.instance.id from OTEL_RESOURCE_ATTRIBUTES; empty = host:pid
    instance_id: str = ""
    # RMQTRACE_EXPORT_CHILD=true: the exporters run in a child process (telemetry.exportchild)
    export_child: bool = False

    def __post_init__(self) -> None:
        if self.otlp_protocol not in PROTOCOLS:
            raise ValueError(f"OTLP protocol {self.otlp_protocol!r} is not supported; use one of {', '.join(PROTOCOLS)}")
        for name in (self.traces_exporter or "otlp").split(","):
            if name not in EXPORTERS:
                raise ValueError(f"OTEL_TRACES_EXPORTER value {name!r} is not supported; use one of {', '.join(EXPORTERS)}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, default_service_name: str | None = None) -> Settings:
        """Read the variables; ``default_service_name`` applies only when neither
        ``OTEL_SERVICE_NAME`` nor ``service.name`` in ``OTEL_RESOURCE_ATTRIBUTES`` is set.

        Raises:
            ValueError: an exporter, protocol or port that cannot work.
        """
        e = environment() if env is None else env
        port = (e.get("RMQTRACE_METRICS_PORT") or "").strip()
        if port and not port.isdigit():
            raise ValueError(f"RMQTRACE_METRICS_PORT must be a port number, got {port!r}")
        exporters = [x.strip().lower() for x in (e.get("OTEL_TRACES_EXPORTER") or "").split(",") if x.strip()]
        child = (e.get("RMQTRACE_EXPORT_CHILD") or "").strip().lower()
        if child not in ("", "true", "false"):
            raise ValueError(f"RMQTRACE_EXPORT_CHILD must be true or false, got {child!r}")
        return cls(
            service_name=(e.get("OTEL_SERVICE_NAME") or "").strip() or _resource_attribute(e, "service.name")
            or default_service_name,
            otlp_endpoint=e.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or e.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None,
            otlp_protocol=(e.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or e.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                           or "http/protobuf").strip().lower(),
            traces_exporter=",".join(exporters) or None,
            sdk_disabled=(e.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"),
            spans_file=e.get("RMQTRACE_SPANS_FILE") or None,
            metrics_port=int(port) if port else None,
            metrics_addr=e.get("RMQTRACE_METRICS_ADDR") or "127.0.0.1",
            consumer_group=e.get("RMQTRACE_CONSUMER_GROUP") or "",
            instance_id=e.get("RMQTRACE_INSTANCE_ID") or _resource_attribute(e, "service.instance.id") or "",
            export_child=child == "true",
        )


def default_instance_id() -> str:
    """``host:pid``: one value per consumer process, so a fleet's spans can be told apart."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _resource_attribute(env: Mapping[str, str], key: str) -> str | None:
    """One attribute of ``OTEL_RESOURCE_ATTRIBUTES`` (``k=v,k=v``, values percent-encoded)."""
    for item in (env.get("OTEL_RESOURCE_ATTRIBUTES") or "").split(","):
        k, sep, v = item.partition("=")
        if sep and k.strip() == key and v.strip():
            return unquote(v.strip())
    return None


def exporter_endpoint(exporter: SpanExporter) -> str | None:
    """Where an OTLP exporter sends (its resolved endpoint), for the lines that name it."""
    endpoint = getattr(exporter, "_endpoint", None)
    return str(endpoint) if endpoint else None


class CountingExporter(SpanExporter):
    """Counts spans the wrapped exporter failed to deliver, so a dead backend is visible, and says
    once, naming the endpoint, that an export failed.

    ``on_taken(n)`` is told, before each export, how many spans left the processor's queue.
    """

    def __init__(self, inner: SpanExporter, on_dropped: DropCounter,
                 on_taken: Callable[[int], None] | None = None) -> None:
        self.inner = inner
        self.on_dropped = on_dropped
        self.on_taken = on_taken
        self._warned = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self.on_taken is not None:
            self.on_taken(len(spans))
        try:
            result = self.inner.export(spans)
        except Exception:  # noqa: BLE001 - exporters should not raise, some do
            log.debug("span export raised", exc_info=True)
            result = SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            self.on_dropped(len(spans))
            if not self._warned:
                self._warned = True
                where = exporter_endpoint(self.inner) or type(self.inner).__name__
                log.warning("rmqtrace: exporting %d span(s) to %s failed; is the collector there? (set "
                            "OTEL_EXPORTER_OTLP_ENDPOINT, or OTEL_TRACES_EXPORTER=none; logged once, every lost "
                            "span is counted)", len(spans), where)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class DropCounter:
    """Spans lost on the way to the backend; ``bind`` mirrors them into ``rmqtrace_spans_dropped``."""

    def __init__(self) -> None:
        self.dropped = 0
        self._metric: object | None = None
        self._lock = threading.Lock()

    def bind(self, counter: object) -> None:
        with self._lock:
            self._metric = counter
            if self.dropped:
                counter.inc(self.dropped)  # type: ignore[attr-defined]

    def __call__(self, n: int) -> None:
        with self._lock:
            self.dropped += n
            if self._metric is not None:
                self._metric.inc(n)  # type: ignore[attr-defined]


def _env_int(name: str, default: int) -> int:
    try:
        return int(environment().get(name) or default)
    except ValueError:
        return default


@dataclass(frozen=True, slots=True)
class SpanQueueStats:
    """A :class:`CountingSpanProcessor` now (:meth:`CountingSpanProcessor.statistics`)."""

    pending: int  # handed to the batch processor, not yet taken by the exporter: at most max_queue_size
    max_queue_size: int
    dropped: int  # every span its DropCounter counted (failed exports and shutdown's leftovers too)


class CountingSpanProcessor(SpanProcessor):
    """A :class:`BatchSpanProcessor` that counts every span it loses.

    The SDK's batch processor drops spans when its queue is full (backend down or slow) and
    counts them only in its opt-in internal metrics. This one keeps the number of spans handed
    over and not yet taken by the exporter; at the queue's capacity it drops the span itself and
    counts it, so the inner queue never overflows. Failed exports are counted by
    :class:`CountingExporter`, spans still queued when shutdown gives up at shutdown. Nothing
    here waits: a dead backend never slows the threads that end spans.
    """

    def __init__(self, exporter: SpanExporter, drops: DropCounter, max_queue_size: int | None = None) -> None:
        if max_queue_size is None:
            max_queue_size = _env_int("OTEL_BSP_MAX_QUEUE_SIZE", 2048)
        self.max_queue_size = max(1, max_queue_size)
        batch = min(self.max_queue_size, max(1, _env_int("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)))
        self.drops = drops
        self._lock = threading.Lock()
        self._pending = 0  # handed to the batch processor, not yet taken by the exporter
        self._closed = False
        self._inner = BatchSpanProcessor(CountingExporter(exporter, drops, self._taken),
                                         max_queue_size=self.max_queue_size, max_export_batch_size=batch)

    def _taken(self, n: int) -> None:
        with self._lock:
            self._pending = max(0, self._pending - n)

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is None or not span.context.trace_flags.sampled:
            return  # the batch processor exports sampled spans only
        with self._lock:
            room = not self._closed and self._pending < self.max_queue_size
            if room:
                self._pending += 1
        if room:
            self._inner.on_end(span)
        else:
            self.drops(1)

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
        self._inner.shutdown()  # type: ignore[no-untyped-call]
        with self._lock:
            left, self._pending = self._pending, 0
        if left:
            self.drops(left)  # never reached the exporter: shutdown ran out of time

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)

    def statistics(self) -> SpanQueueStats:
        with self._lock:
            pending = self._pending
        return SpanQueueStats(pending, self.max_queue_size, self.drops.dropped)


def make_exporters(settings: Settings) -> list[SpanExporter]:
    """The exporters ``OTEL_TRACES_EXPORTER`` asks for (see :class:`Settings` for the default).

    OTLP exporters read their endpoint, headers and timeout from ``OTEL_*`` themselves, so an
    unset endpoint is the SDK's default one.
    """
    names = settings.traces_exporter.split(",") if settings.traces_exporter else []
    if not names:
        names = ["spans_file"] if settings.spans_file and not settings.otlp_endpoint else ["otlp"]
    out: list[SpanExporter] = []
    for name in dict.fromkeys(names):
        if name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter
            out.append(ConsoleSpanExporter())
        elif name == "spans_file":
            from .telemetry.spanfile import JsonLinesSpanExporter
            out.append(JsonLinesSpanExporter(settings.spans_file or ""))
        elif name == "otlp" and settings.otlp_protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
            out.append(GrpcExporter())
        elif name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
            out.append(HttpExporter())
    return out  # "none" adds nothing


def child_exporters(**fields: object) -> list[SpanExporter]:
    """The export child's exporters (:mod:`tracer.telemetry.exportchild`): :func:`make_exporters`
    of the parent's :class:`Settings` fields, built in the child from its (inherited) environment."""
    return make_exporters(Settings(**fields))  # type: ignore[arg-type]


def _child_fields(settings: Settings) -> dict[str, object]:
    return {"otlp_endpoint": settings.otlp_endpoint, "otlp_protocol": settings.otlp_protocol,
            "traces_exporter": settings.traces_exporter, "spans_file": settings.spans_file}


def _processors(settings: Settings, drops: DropCounter | None) -> list[SpanProcessor]:
    """One processor per exporter, or with ``export_child`` one that sends every span to the child."""
    if settings.export_child:
        if (settings.traces_exporter or "") == "none":
            return []
        from .telemetry.exportchild import ChildExportProcessor

        log.info("rmqtrace: spans go to an export child process (RMQTRACE_EXPORT_CHILD), which sends them %s",
                 f"to {settings.otlp_endpoint}" if settings.otlp_endpoint else "as OTEL_TRACES_EXPORTER says")
        # OTEL_BSP_* as the in-process path reads them (the batch at most the queue); the schedule
        # delay when set, else the child's 0.2 s (a wake costs a lock and a notify, not an export)
        queue = max(1, _env_int("OTEL_BSP_MAX_QUEUE_SIZE", 2048))
        delay_ms = _env_int("OTEL_BSP_SCHEDULE_DELAY", 200)
        return [ChildExportProcessor(factory_args=_child_fields(settings), drops=drops or DropCounter(),
                                     max_queue_size=queue,
                                     max_batch_size=min(queue, max(1, _env_int("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512))),
                                     interval_s=min(3599.0, delay_ms / 1000) if delay_ms > 0 else 0.2)]
    exporters = make_exporters(settings)
    for exporter in exporters:
        endpoint = exporter_endpoint(exporter)
        if endpoint is not None:
            # The standard OTel behaviour: OTLP by default, to the SDK's default endpoint when
            # OTEL_EXPORTER_OTLP_ENDPOINT is unset. Said once, so a missing collector is no mystery.
            log.info("rmqtrace: spans go by OTLP to %s%s", endpoint,
                     "" if settings.otlp_endpoint else " (OTEL_EXPORTER_OTLP_ENDPOINT is unset: the SDK's default)")
    return [
        CountingSpanProcessor(exporter, drops) if drops is not None
        else BatchSpanProcessor(CountingExporter(exporter, DropCounter()))
        for exporter in exporters
    ]


def configure_tracing(settings: Settings, *, set_global: bool = True,
                      drops: DropCounter | None = None, metrics: TracerMetrics | None = None) -> TracerProvider | None:
    """Build an SDK tracer provider for ``settings``, unless one is already installed.

    When the application or ``opentelemetry-instrument`` set up the SDK already, that provider
    is returned untouched: its exporters and samplers are the user's choice. With ``drops``,
    every span lost (queue full, export failed) is counted there; with ``metrics``, also in
    ``rmqtrace_spans_dropped_total``.
    """
    policy_drops = DropCounter()  # late spans of traces the keep policy dropped: not a loss
    if metrics is not None:
        drops = drops or DropCounter()
        drops.bind(metrics.spans_dropped)
        policy_drops.bind(metrics.spans_policy_dropped)
    if settings.sdk_disabled:
        return None
    keep_env = keep_variables()  # RMQTRACE_KEEP_*, one reading for the policy and its hold
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        keep_for(current, keep_env)  # RMQTRACE_KEEP_* still applies, in front of the processors it has
        if settings.export_child:
            log.warning("rmqtrace: RMQTRACE_EXPORT_CHILD is set, but a tracer provider was installed before "
                        "(opentelemetry-instrument or the application): its span processors are kept as they are; "
                        "add tracer.telemetry.exportchild.ChildExportProcessor to it yourself")
        return current
    # Resource.create reads OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME and falls back to
    # "unknown_service:<executable>"; only an explicit name is passed on top.
    attrs = {"service.instance.id": settings.instance_id or default_instance_id()}
    if settings.service_name:
        attrs["service.name"] = settings.service_name
    provider = TracerProvider(resource=Resource.create(attrs))
    processors = _processors(settings, drops)
    keep = KeepPolicy.from_env(keep_env)  # decide again at handler end (telemetry.keep)
    if keep is not None and processors:  # OTEL_TRACES_EXPORTER=none: nothing exported, nothing to keep
        # spans the hold loses (bounds, age, shutdown) count with the export losses
        # (rmqtrace_spans_dropped); late spans of dropped traces in rmqtrace_spans_policy_dropped
        hold = HoldingSpanProcessor.from_env(processors, keep_env, on_dropped=drops, on_policy_dropped=policy_drops)
        provider.add_span_processor(hold)
        install(provider, keep, hold)  # a MessageTracer writing into this provider picks them up
    else:
        for processor in processors:
            provider.add_span_processor(processor)
    if set_global:
        trace.set_tracer_provider(provider)
    return provider


def serve_metrics(settings: Settings, registry: object | None = None) -> object | None:
    """Start the ``/metrics`` HTTP server on ``metrics_addr:metrics_port`` (loopback default).

    Under ``PROMETHEUS_MULTIPROC_DIR`` it serves every process's series, read from that directory
    by a ``MultiProcessCollector`` (one worker's own registry would show only its share).
    """
    if settings.metrics_port is None:
        return None
    from prometheus_client import REGISTRY, CollectorRegistry, start_http_server

    path = multiprocess_dir()
    if path is not None:
        from prometheus_client.multiprocess import MultiProcessCollector

        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=path)  # type: ignore[no-untyped-call]
    server, _thread = start_http_server(settings.metrics_port, addr=settings.metrics_addr,
                                        registry=registry or REGISTRY)  # type: ignore[arg-type]
    return server
