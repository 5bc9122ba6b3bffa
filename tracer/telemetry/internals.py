"""Every private name of another package that rmqtrace reaches into, in one list.

Each entry says whose internal it is, whether rmqtrace only reads it or also writes it, which
versions the fast branch was written against, and what happens on a version without it (every
use is guarded: a missing internal falls back to the public API, at a cost the entry names).
``tests/test_internals.py`` fails when the code touches a private name missing from this list,
and when a listed internal is gone from the installed version.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Internal:
    owner: str
    """Dotted path of the class (or module) that holds the name."""
    name: str
    written: bool
    versions: str
    """The versions the branch that uses the name was written and tested against."""
    without: str
    """What rmqtrace does on a version without it."""


OTEL_SDK = "opentelemetry-sdk >=1.25, tested 1.45"
ROCKETMQ = "rocketmq-python-client 5.1.2"
LEGACY = "rocketmq-client-python 2.0.0 (librocketmq 2.x)"

# The export child reads a finished span's fields, not its properties (which copy events, links and
# attributes), once per exported span under the consumer's GIL.
_SPAN_FIELDS = "none: RMQTRACE_EXPORT_CHILD needs it (off by default); tests/test_layers.py names the missing one"

INTERNALS: tuple[Internal, ...] = (
    Internal("opentelemetry.sdk.trace.ReadableSpan", "_name", False, OTEL_SDK, _SPAN_FIELDS),
    Internal("opentelemetry.sdk.trace.ReadableSpan", "_context", False, OTEL_SDK, _SPAN_FIELDS),
    Internal("opentelemetry.sdk.trace.ReadableSpan", "_parent", False, OTEL_SDK, _SPAN_FIELDS),
    Internal("opentelemetry.sdk.trace.ReadableSpan", "_kind", False, OTEL_SDK, _SPAN_FIELDS),
    Internal("opentelemetry.sdk.trace.ReadableSpan", "_start_time", False, OTEL_SDK, _SPAN_FIELDS),
    Internal("opentelemetry.sdk.trace.ReadableSpan", "_end_time", False, OTEL_SDK, _SPAN_FIELDS),
    Internal("opentelemetry.sdk.trace.ReadableSpan", "_attributes", False, OTEL_SDK, _SPAN_FIELDS),
    Internal("opentelemetry.sdk.trace.ReadableSpan", "_events", False, OTEL_SDK, _SPAN_FIELDS),
    Internal("opentelemetry.sdk.trace.ReadableSpan", "_links", False, OTEL_SDK, _SPAN_FIELDS),
    Internal("opentelemetry.sdk.trace.ReadableSpan", "_status", False, OTEL_SDK, _SPAN_FIELDS),
    Internal("opentelemetry.sdk.trace.TracerProvider", "_active_span_processor", False, OTEL_SDK,
             "the hold and the abandon hook are added with add_span_processor (after the exporters)"),
    Internal("opentelemetry.sdk.trace.SynchronousMultiSpanProcessor", "_span_processors", True, OTEL_SDK,
             "as above: put first in the chain only when this tuple can be replaced; the spans we write go "
             "through the multi processor's on_start/on_end (tracer.telemetry.chain)"),
    Internal("opentelemetry.sdk.trace.SynchronousMultiSpanProcessor", "_lock", False, OTEL_SDK,
             "as above: the tuple is replaced under the processor's own lock or not at all"),
    Internal("opentelemetry.sdk.trace.export.BatchSpanProcessor", "_batch_processor", False, OTEL_SDK,
             "a sampled span we write reaches the batch processor through its on_end (tracer.telemetry.chain)"),
    Internal("opentelemetry.trace.ProxyTracer", "_real_tracer", False, OTEL_SDK,
             "a proxy tracer is taken as not the SDK's: spans through the API (slower, same content)"),
    Internal("opentelemetry.sdk.trace.Tracer", "_is_enabled", False, OTEL_SDK, "taken as enabled"),
    Internal("opentelemetry.sdk.trace.Tracer", "_span_limits", False, OTEL_SDK,
             "the SDK's default limits (our own attributes unbounded below a length limit)"),
    Internal("opentelemetry.sdk.trace.sampling.StaticSampler", "_decision", False, OTEL_SDK,
             "the sampler is called (should_sample) instead of evaluated inline"),
    Internal("opentelemetry.sdk.trace.sampling.ParentBased", "_root", False, OTEL_SDK, "as above"),
    Internal("opentelemetry.sdk.trace.sampling.ParentBased", "_remote_parent_sampled", False, OTEL_SDK, "as above"),
    Internal("opentelemetry.sdk.trace.sampling.ParentBased", "_remote_parent_not_sampled", False, OTEL_SDK,
             "as above"),
    Internal("opentelemetry.sdk.trace.sampling.ParentBased", "_local_parent_sampled", False, OTEL_SDK, "as above"),
    Internal("opentelemetry.sdk.trace.sampling.ParentBased", "_local_parent_not_sampled", False, OTEL_SDK,
             "as above"),
    Internal("opentelemetry.sdk.trace.sampling", "_AlwaysOn", False, OTEL_SDK, "as above, for ALWAYS_ON"),
    Internal("opentelemetry.sdk.trace.sampling", "_AlwaysOff", False, OTEL_SDK, "as above, for ALWAYS_OFF"),
    Internal("opentelemetry.sdk.trace.sampling", "_ParentBasedAlwaysOn", False, OTEL_SDK,
             "as above, for OTEL_TRACES_SAMPLER=parentbased_always_on"),
    Internal("opentelemetry.sdk.trace.sampling", "_ParentBasedAlwaysOff", False, OTEL_SDK,
             "as above, for OTEL_TRACES_SAMPLER=parentbased_always_off"),
    Internal("opentelemetry.exporter.otlp.proto.http.trace_exporter.OTLPSpanExporter", "_endpoint", False,
             OTEL_SDK, "start-up does not name the endpoint"),
    Internal("rocketmq.v5.client.Client", "_init_settings_event", False, ROCKETMQ,
             "receiving does not wait for the client's settings (its first receive may log a traceback)"),
    Internal("rocketmq.client.ReceivedMessage", "_handle", False, LEGACY,
             "the producer-side fields the C API exposes are not read: no produce stamps on the 2.x listener"),
)

__all__ = ["INTERNALS", "LEGACY", "Internal"]
