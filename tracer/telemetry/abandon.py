"""End still-running handlers' spans when the tracer provider shuts down.

A handler the dispatcher's watchdog reported ``TIMEOUT`` may still run (a thread cannot be
stopped); its ``handler`` span stays open for its late return, since the user's spans nest under
it — and so does any handler still running when the process ends (no ``handler_timeout``, a
``stop(timeout=)`` that returned before it). Should it never return before the process ends, that
span was never exported and every span the handler started reads as an orphan. :class:`AbandonOnShutdown` sits **in front of** the
provider's span processors, so at ``shutdown()`` (the provider's own ``atexit`` too) it ends those
spans (:meth:`tracer.telemetry.tracer.MessageTracer.abandon_handlers`) while the processors after
it can still export them. ``force_flush()`` ends nothing: a handler may still return after it.

Putting it in front reaches into the SDK internal :mod:`tracer.telemetry.adopt` uses
(``TracerProvider._active_span_processor._span_processors``, opentelemetry-sdk 1.45); without it
the hook is appended (it then runs after the others, whose exports may be closed) and a warning
says so, once per provider.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any, Protocol

from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider

__all__ = ["AbandonOnShutdown", "Abandons", "HandlerAbandoned", "watch_shutdown"]

log = logging.getLogger(__name__)

_lock = threading.Lock()
_hooks: weakref.WeakKeyDictionary[Any, AbandonOnShutdown] = weakref.WeakKeyDictionary()


class HandlerAbandoned(Exception):
    """The error of a message whose handler still ran when the tracer provider shut down: it is
    finished then as a ``timeout`` (the process ends under it; the broker redelivers it)."""


class Abandons(Protocol):
    """What the hook needs of a tracer (``MessageTracer``; this module sits below it)."""

    def abandon_handlers(self) -> int: ...


class AbandonOnShutdown(SpanProcessor):
    """At the provider's shutdown, ends the open handler spans of every tracer it watches."""

    def __init__(self) -> None:
        self._tracers: weakref.WeakSet[Abandons] = weakref.WeakSet()
        self._lock = threading.Lock()

    def watch(self, tracer: Abandons) -> None:
        with self._lock:
            self._tracers.add(tracer)

    def shutdown(self) -> None:
        with self._lock:
            tracers = list(self._tracers)
        for t in tracers:
            try:
                t.abandon_handlers()
            except Exception:  # noqa: BLE001 - the rest of the shutdown must go on
                log.exception("rmqtrace: ending abandoned handler spans at shutdown failed")

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def watch_shutdown(provider: Any, tracer: Abandons) -> None:
    """Have ``provider``'s shutdown end ``tracer``'s abandoned handler spans (one hook per provider)."""
    if not isinstance(provider, SdkTracerProvider):
        return
    try:
        with _lock:
            hook = _hooks.get(provider)
            if hook is None:
                hook = _hooks[provider] = AbandonOnShutdown()
                _install(provider, hook)
    except TypeError:  # not weak-referenceable
        return
    hook.watch(tracer)


def _install(provider: SdkTracerProvider, hook: AbandonOnShutdown) -> None:
    multi: Any = getattr(provider, "_active_span_processor", None)
    inner = getattr(multi, "_span_processors", None)
    plock = getattr(multi, "_lock", None)
    if isinstance(inner, tuple) and plock is not None:
        with plock:
            multi._span_processors = (hook, *multi._span_processors)
        return
    log.warning("rmqtrace: this opentelemetry-sdk's TracerProvider has no _active_span_processor._span_processors: "
                "timed-out handlers' spans are ended at shutdown after the exporters have shut down (may be lost)")
    provider.add_span_processor(hook)
