"""Spans and histograms from stamps: the message tracer, deferred spans, metrics, the span file."""

from .metrics import TracerMetrics
from .tracer import MessageTrace, MessageTracer, SendTrace
from .tracerconfig import TracerConfig

__all__ = ["MessageTrace", "MessageTracer", "SendTrace", "TracerConfig", "TracerMetrics"]
