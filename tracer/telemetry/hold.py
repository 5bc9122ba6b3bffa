"""Hold a message's spans until its keep decision, then hand them on or drop them.

The user's handler opens spans under rmqtrace's ``handler`` span before anyone knows whether the
message will be slow. :class:`HoldingSpanProcessor` wraps the span processors the user
configured (batch, simple, several): spans of a trace that rmqtrace marked with :meth:`hold`
are kept in memory when they end, and :meth:`release` either forwards them to every wrapped
processor (the trace is kept, complete) or forgets them (the trace is dropped, and costs no
export). Spans of any other trace pass straight through.

Memory is bounded twice: at most ``max_spans`` held spans and ``max_traces`` undecided traces.
Beyond either bound the newest span (or the oldest undecided trace) is dropped and counted in
:attr:`dropped`, and ``on_dropped`` is told, so a kept trace that lost spans is visible.

Install it in place of the processors it wraps::

    hold = HoldingSpanProcessor([BatchSpanProcessor(OTLPSpanExporter())])
    provider.add_span_processor(hold)
    tracer = MessageTracer(tracer_provider=provider, keep=KeepPolicy.from_env(), hold=hold)
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Mapping, NamedTuple, Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import SpanContext, TraceFlags, TraceState

__all__ = ["HoldStats", "HoldingSpanProcessor", "install_for_global_provider", "installed_for_global_provider"]

DEFAULT_MAX_SPANS = 20_000
DEFAULT_MAX_TRACES = 20_000
# Dropped traces remembered so a span ending after the decision (a thread the handler started)
# is dropped with its trace instead of leaking out as an orphan.
_RECENTLY_DROPPED = 4096
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


class HoldStats(NamedTuple):
    """A snapshot of what is held and what happened to held spans."""

    held_spans: int
    held_traces: int
    dropped: int  # spans lost to a bound or never decided
    forwarded: int  # held spans handed on when their trace was kept


class HoldingSpanProcessor(SpanProcessor):
    """Forwards spans to ``processors``; holds those of traces marked by :meth:`hold`.

    Raises:
        ValueError: for an empty processor list or bounds below 1.
    """

    def __init__(self, processors: Sequence[SpanProcessor], *, max_spans: int = DEFAULT_MAX_SPANS,
                 max_traces: int = DEFAULT_MAX_TRACES, on_dropped: Callable[[int], None] | None = None) -> None:
        if not processors:
            raise ValueError("HoldingSpanProcessor needs at least one span processor to forward to")
        if max_spans < 1 or max_traces < 1:
            raise ValueError("max_spans and max_traces must be at least 1")
        self.processors = tuple(processors)
        self.max_spans = max_spans
        self.max_traces = max_traces
        self.on_dropped = on_dropped
        self._lock = threading.Lock()
        # trace id -> its held spans; insertion order = oldest undecided trace first
        self._held: dict[int, list[ReadableSpan]] = {}
        self._n_spans = 0
        self._gone: dict[int, None] = {}  # recently dropped trace ids, oldest first
        self.dropped = 0
        self.forwarded = 0

    @classmethod
    def from_env(cls, processors: Sequence[SpanProcessor], env: Mapping[str, str] | None = None,
                 on_dropped: Callable[[int], None] | None = None) -> HoldingSpanProcessor:
        """Bounds from ``RMQTRACE_KEEP_HELD_SPANS`` (spans; undecided traces get the same bound).

        Raises:
            ValueError: when the variable is not a positive integer.
        """
        e = os.environ if env is None else env
        raw = e.get("RMQTRACE_KEEP_HELD_SPANS", "").strip()
        try:
            n = int(raw) if raw else DEFAULT_MAX_SPANS
        except ValueError:
            raise ValueError(f"RMQTRACE_KEEP_HELD_SPANS must be a positive integer, got {raw!r}") from None
        return cls(processors, max_spans=n, max_traces=n, on_dropped=on_dropped)

    # -- rmqtrace's side ----------------------------------------------------------------
    def hold(self, trace_id: int) -> None:
        """Hold every span of ``trace_id`` that ends from now on, until :meth:`release`."""
        evicted: list[ReadableSpan] | None = None
        with self._lock:
            if trace_id in self._held:
                return
            self._gone.pop(trace_id, None)
            if len(self._held) >= self.max_traces:
                oldest = next(iter(self._held))
                evicted = self._held.pop(oldest)
                self._n_spans -= len(evicted)
            self._held[trace_id] = []
        if evicted is not None:
            self._drop(len(evicted) or 1)  # an undecided trace lost, with whatever it held

    def open_trace(self, ids: IdGenerator, trace_state: TraceState | None = None) -> SpanContext:
        """A new sampled root context, its trace held (the trace a keep policy decides later)."""
        ctx = SpanContext(ids.generate_trace_id(), ids.generate_span_id(), is_remote=False,
                          trace_flags=_SAMPLED, trace_state=trace_state)
        self.hold(ctx.trace_id)
        return ctx

    def release(self, trace_id: int, keep: bool) -> None:
        """Forward the trace's held spans (``keep``) or forget them; later spans pass through."""
        with self._lock:
            spans = self._held.pop(trace_id, None)
            if spans is None:
                return
            self._n_spans -= len(spans)
            if not keep:
                gone = self._gone
                gone[trace_id] = None
                if len(gone) > _RECENTLY_DROPPED:
                    del gone[next(iter(gone))]
        if keep and spans:
            for span in spans:
                for p in self.processors:
                    p.on_end(span)
            with self._lock:
                self.forwarded += len(spans)

    def stats(self) -> HoldStats:
        with self._lock:
            return HoldStats(self._n_spans, len(self._held), self.dropped, self.forwarded)

    def _drop(self, n: int) -> None:
        with self._lock:
            self.dropped += n
        if self.on_dropped is not None:
            self.on_dropped(n)

    # -- the SDK's side -----------------------------------------------------------------
    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        for p in self.processors:
            p.on_start(span, parent_context=parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        ctx = span.context
        if ctx is not None and ctx.trace_id in self._held:  # unlocked peek; rechecked below
            with self._lock:
                spans = self._held.get(ctx.trace_id)
                if spans is not None:
                    if self._n_spans < self.max_spans:
                        spans.append(span)
                        self._n_spans += 1
                        return
                    full = True
                else:
                    full = False  # released meanwhile: pass it on
            if full:
                self._drop(1)
                return
        if ctx is not None and ctx.trace_id in self._gone:
            return  # its trace was dropped: a late span goes with it
        for p in self.processors:
            p.on_end(span)

    def shutdown(self) -> None:
        with self._lock:
            left = self._n_spans
            self._held.clear()
            self._n_spans = 0
        if left:
            self._drop(left)  # never decided
        for p in self.processors:
            p.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return all(p.force_flush(timeout_millis) for p in self.processors)


# The keep policy and hold that ``tracer.config.configure_tracing`` built from ``RMQTRACE_KEEP_*``
# for the global provider: a MessageTracer on the global provider picks them up, so the
# environment alone turns latency-aware keeping on (like OTEL_TRACES_SAMPLER does for the head).
_installed: tuple[Any, HoldingSpanProcessor] | None = None


def install_for_global_provider(keep: Any, hold: HoldingSpanProcessor) -> None:
    global _installed
    _installed = (keep, hold)


def installed_for_global_provider() -> tuple[Any, HoldingSpanProcessor] | None:
    return _installed
