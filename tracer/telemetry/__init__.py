"""Spans and histograms from stamps: the message tracer, deferred spans, metrics, the span file."""

from .metrics import TracerMetrics
from .tracer import MessageTrace, MessageTracer, SendTrace

__all__ = ["MessageTrace", "MessageTracer", "SendTrace", "TracerMetrics"]
