"""The provider's span processors as the calls that do something, for the spans rmqtrace writes.

The SDK hands every span to ``SynchronousMultiSpanProcessor``, which calls each processor's
``on_start``/``on_end`` in order. For a span rmqtrace writes (:mod:`tracer.telemetry.spans`) that
costs, per span, the multi processor's frame, one frame per processor whose hook has an empty body
(rmqtrace's own shutdown hook, ``BatchSpanProcessor.on_start``) and, for a sampled span and a
``BatchSpanProcessor``, its ``on_end`` frame and four property reads before the one call that
matters, its queue's ``emit`` (five spans a full trace; docs/benchmarks-history.md, "Session 9").
:class:`ProcessorChain` keeps the flattened calls for the multi processor's current tuple of
processors (rebuilt when a processor is added) and makes exactly the calls the SDK's chain would
make that have an effect, in the same order: a hook whose body is empty is skipped, and a sampled
span goes straight to an exact ``BatchSpanProcessor``'s queue (its ``on_end`` does nothing else).
An unsampled span, and any other active processor than the SDK's synchronous multi processor, go
through the SDK's own chain. ``tests/test_processor_chain.py`` checks every call against it.

SDK internals used here (opentelemetry-sdk 1.45, in :mod:`tracer.telemetry.internals`):
``SynchronousMultiSpanProcessor._span_processors`` and ``BatchSpanProcessor._batch_processor``.
"""

from __future__ import annotations

import dis
from typing import Any, Callable

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, SynchronousMultiSpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor

__all__ = ["ProcessorChain", "does_nothing"]

_EMPTY_BODIES = ([("LOAD_CONST", None), ("RETURN_VALUE", None)], [("RETURN_CONST", None)])
_NOT_OPS = frozenset({"RESUME", "NOP", "CACHE"})


def does_nothing(method: Any) -> bool:
    """Whether ``method`` (a bound method or function) is a plain function whose body is empty
    (``pass``, a docstring, ``return None``): calling it has no effect."""
    fn = getattr(method, "__func__", method)
    code = getattr(fn, "__code__", None)
    if code is None or type(fn).__name__ != "function":
        return False
    ops = [(i.opname, i.argval) for i in dis.get_instructions(code) if i.opname not in _NOT_OPS]
    return ops in _EMPTY_BODIES


class ProcessorChain:
    """The calls ``active`` (a provider's span processor) makes for a span, the empty ones left out.

    ``starts``/``ends`` are valid for the multi processor's current processors: call
    :meth:`current` (cheap: an identity check) before reading them. ``flat`` is False when the
    active processor is not the SDK's ``SynchronousMultiSpanProcessor``; then use its own hooks.
    """

    __slots__ = ("active", "flat", "starts", "ends", "seen")

    def __init__(self, active: SpanProcessor) -> None:
        self.active = active
        self.flat = type(active) is SynchronousMultiSpanProcessor and isinstance(
            getattr(active, "_span_processors", None), tuple)
        self.starts: tuple[Callable[..., None], ...] = ()
        # the calls for a sampled span that has ended
        self.ends: tuple[Callable[[ReadableSpan], None], ...] = ()
        self.seen: object = None  # the processors tuple the calls were made from

    def current(self) -> None:
        """Rebuild the calls if the multi processor's processors changed since they were made."""
        procs = self.active._span_processors  # type: ignore[attr-defined]
        if procs is not self.seen:
            self.build(procs)

    def build(self, procs: tuple[SpanProcessor, ...]) -> None:
        starts: list[Callable[..., None]] = []
        ends: list[Callable[[ReadableSpan], None]] = []
        for p in procs:
            start = p.on_start
            if not does_nothing(start):
                starts.append(start)
            queue = getattr(p, "_batch_processor", None) if type(p) is BatchSpanProcessor else None
            emit = getattr(queue, "emit", None)
            if emit is not None:
                ends.append(emit)  # BatchSpanProcessor.on_end for a sampled span: this call alone
            elif not does_nothing(p.on_end):
                ends.append(p.on_end)
        self.starts, self.ends, self.seen = tuple(starts), tuple(ends), procs

    def on_start(self, span: Any, parent_context: Context | None) -> None:
        """What the active processor's ``on_start(span, parent_context)`` does."""
        if not self.flat:
            self.active.on_start(span, parent_context)
            return
        self.current()
        for start in self.starts:
            start(span, parent_context=parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        """What the active processor's ``on_end(span)`` does."""
        ctx = span.context
        if not self.flat or ctx is None or not ctx.trace_flags & 1:
            self.active.on_end(span)
            return
        self.current()
        for end in self.ends:
            end(span)
