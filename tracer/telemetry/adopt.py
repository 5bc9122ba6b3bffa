"""``RMQTRACE_KEEP_*`` for a tracer provider rmqtrace did not build (``opentelemetry-instrument``).

:func:`tracer.config.configure_tracing` builds the keep policy and the hold into the provider it
makes. Under ``opentelemetry-instrument`` (or any application that set up the SDK itself) the
provider already exists, with the user's processors on it; setting ``RMQTRACE_KEEP_*`` must still
mean something. :func:`keep_for` puts a :class:`~tracer.telemetry.hold.HoldingSpanProcessor` in
front of that provider's processors — once per provider — so held spans reach them only when
their trace is kept. That reaches into one SDK internal (``TracerProvider._active_span_processor``
and its ``_span_processors``, opentelemetry-sdk 1.45); when it is not there, or the provider is not
the SDK's, the policy cannot apply and a warning says so, once per provider.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any, Mapping

from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider

from .hold import HoldingSpanProcessor
from .keep import KeepPolicy

__all__ = ["install", "keep_for"]

log = logging.getLogger(__name__)

_lock = threading.Lock()
_by_provider: weakref.WeakKeyDictionary[Any, tuple[KeepPolicy, HoldingSpanProcessor] | None] = (
    weakref.WeakKeyDictionary())


def install(provider: Any, keep: KeepPolicy, hold: HoldingSpanProcessor) -> None:
    """Record the policy and hold a provider was built with (configure_tracing does)."""
    with _lock:
        _by_provider[provider] = (keep, hold)


def keep_for(provider: Any, env: Mapping[str, str] | None = None) -> tuple[KeepPolicy, HoldingSpanProcessor] | None:
    """The keep policy and hold in force for ``provider``: the ones it was built with, else, when
    ``RMQTRACE_KEEP_*`` is set, new ones put in front of its processors (once). None when no
    policy applies (a warning, once, says why when one was asked for).

    Raises:
        ValueError: a ``RMQTRACE_KEEP_*`` value that cannot work.
    """
    try:
        with _lock:
            if provider in _by_provider:
                return _by_provider[provider]
    except TypeError:  # not weak-referenceable: a foreign object; nothing to remember it by
        pass
    keep = KeepPolicy.from_env(env)
    if keep is None:
        return None
    found = _adopt(provider, keep, env)
    try:
        with _lock:
            return _by_provider.setdefault(provider, found)
    except TypeError:
        return found


def _adopt(provider: Any, keep: KeepPolicy, env: Mapping[str, str] | None) -> tuple[KeepPolicy, HoldingSpanProcessor] | None:
    name = f"{type(provider).__module__}.{type(provider).__qualname__}"
    if not isinstance(provider, SdkTracerProvider):
        log.warning("rmqtrace: RMQTRACE_KEEP_* is set but the tracer provider is %s, not the OpenTelemetry "
                    "SDK's: no keep policy applies (traces follow the provider's own sampler)", name)
        return None
    multi: Any = getattr(provider, "_active_span_processor", None)
    inner = getattr(multi, "_span_processors", None)
    plock = getattr(multi, "_lock", None)
    if not isinstance(inner, tuple) or plock is None:
        log.warning("rmqtrace: RMQTRACE_KEEP_* is set but this opentelemetry-sdk's TracerProvider has no "
                    "_active_span_processor._span_processors to put the hold in front of: no keep policy applies")
        return None
    if any(isinstance(p, HoldingSpanProcessor) for p in inner):
        return None  # someone installed a hold by hand; their keep= goes with it
    if not inner:
        log.warning("rmqtrace: RMQTRACE_KEEP_* is set but the tracer provider has no span processor: nothing "
                    "is exported, so there is nothing to keep")
        return None
    hold = HoldingSpanProcessor.from_env(inner, env)
    with plock:
        multi._span_processors = (hold,)
    log.info("rmqtrace: RMQTRACE_KEEP_* applied to the existing tracer provider: its %d span processor(s) "
             "now receive held traces only when kept", len(inner))
    return keep, hold
