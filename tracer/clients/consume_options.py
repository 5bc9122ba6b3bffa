"""The consume loop's options: three frozen groups, each configuring one part of the loop.

:class:`DispatchOptions` (how received messages run), :class:`LeaseOptions` (how long the broker
keeps a held message invisible, and how the loop renews it) and :class:`FlowOptions` (receives,
prefetch, acks, retries, stop). :class:`~tracer.clients.consume.ConsumeLoop` also takes their
fields as flat keywords (:class:`ConsumeKeywords`). Every field is checked at construction: an
option that cannot work raises ``ValueError`` (or ``TypeError``) here, never later in a thread.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, TypedDict

from ..callables import require_plain
from ..dispatch import DispatchMetrics, Policy

__all__ = [
    "MAX_BATCH",
    "MAX_INVISIBLE_S",
    "MIN_INVISIBLE_S",
    "ConsumeKeywords",
    "DispatchOptions",
    "FlowOptions",
    "LeaseOptions",
    "exponential_backoff",
    "resolve_options",
    "whole_seconds",
]

MAX_INVISIBLE_S = 12 * 3600.0  # the proxy's maxInvisibleTimeMills default: longer leases are refused
MIN_INVISIBLE_S = 1.0  # RocketMQ counts invisibility in whole seconds: 1 s is the shortest lease it grants
MAX_BATCH = 32  # the proxy's grpcClientConsumerLongPollingBatchSize: a receive returns at most this many
_MAX_BACKOFF_EXPONENT = 64  # 2**64 s is beyond any cap; beyond it 2.0**n overflows (n >= 1024)


def whole_seconds(seconds: float) -> int:
    """What the broker is told: RocketMQ counts invisibility in whole seconds, and the 5.x client
    rejects anything but an ``int`` (a float fails every receive and every lease renewal)."""
    return max(1, math.ceil(seconds))


def exponential_backoff(attempt: int, base: float = 1.0, cap: float = 60.0) -> float:
    """Seconds until a failed delivery comes back: 1, 2, 4 … capped (any attempt, however large)."""
    exponent = min(max(0, attempt - 1), _MAX_BACKOFF_EXPONENT)
    return float(min(cap, base * (2.0**exponent)))


def _finite_positive(name: str, value: object, *, allow_zero: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (value < 0 if allow_zero else value <= 0):  # type: ignore[operator]
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number of seconds {bound}, got {value!r}")


def _callable_or_none(name: str, fn: object) -> None:
    require_plain(fn, f"{name}=", optional=True)


@dataclass(frozen=True)
class DispatchOptions:
    """How received messages run: passed to the loop's :class:`~tracer.dispatch.Dispatcher`."""

    policy: Policy | str = "aggressive"
    workers: int = 8
    key: Callable[[Any], str | None] | None = None
    cost: Callable[[Any], float] | None = None
    metrics: DispatchMetrics | None = None
    handler_timeout: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise ValueError(f"workers must be an int >= 1, got {self.workers!r}")
        if self.handler_timeout is not None:
            _finite_positive("handler_timeout", self.handler_timeout)
        _callable_or_none("key", self.key)
        _callable_or_none("cost", self.cost)


@dataclass(frozen=True)
class LeaseOptions:
    """How long the broker keeps a held message invisible, and when the loop renews or gives up.

    ``invisible_duration``: seconds per lease, at least 1 (RocketMQ grants whole seconds; a
    fraction is rounded up for the broker while the loop keeps the exact value as its own,
    earlier, deadline; the proxy refuses receives below its ``minInvisibleTimeMillsForRecv``,
    10 s by default, and leases above 12 h). ``renew_margin``: renew when less than this is
    left (default a third of the lease). ``hang_grace``: a handler still running
    ``handler_timeout + hang_grace`` seconds after it started is abandoned — its lease is no
    longer renewed (default one lease). ``renew_threads``: at most this many renewal calls run
    at once (each is one broker round trip; many leases ending together are renewed side by
    side, so a slow broker call does not push the others past their end).
    """

    invisible_duration: float = 30.0
    renew_margin: float | None = None
    hang_grace: float | None = None
    renew_threads: int = 8

    def __post_init__(self) -> None:
        _finite_positive("invisible_duration", self.invisible_duration)
        if not MIN_INVISIBLE_S <= self.invisible_duration <= MAX_INVISIBLE_S:
            raise ValueError(f"invisible_duration must be in [{MIN_INVISIBLE_S:g}, {MAX_INVISIBLE_S:g}] seconds "
                             f"(the broker grants whole seconds, and refuses longer leases), "
                             f"got {self.invisible_duration}")
        if self.renew_margin is not None:
            _finite_positive("renew_margin", self.renew_margin)
            if not self.renew_margin < self.invisible_duration:
                raise ValueError(f"renew_margin must be in (0, invisible_duration={self.invisible_duration:g}), "
                                 f"got {self.renew_margin}")
        if self.hang_grace is not None:
            _finite_positive("hang_grace", self.hang_grace, allow_zero=True)
        if isinstance(self.renew_threads, bool) or not isinstance(self.renew_threads, int) or self.renew_threads < 1:
            raise ValueError(f"renew_threads must be an int >= 1, got {self.renew_threads!r}")

    @property
    def margin(self) -> float:
        return self.renew_margin if self.renew_margin is not None else self.invisible_duration / 3

    @property
    def grace(self) -> float:
        return self.hang_grace if self.hang_grace is not None else self.invisible_duration


@dataclass(frozen=True)
class FlowOptions:
    """How messages come in and go out: receive batches, prefetch, acks, retries, stop.

    ``prefetch`` > 0 imitates a push consumer's local cache (the 5.x client keeps up to 1024
    messages per queue): messages are received ahead and wait in the loop, unseen by other
    consumers, until the dispatcher takes them (leases renewed all the while). Kept to reproduce
    the incident; 0 (the default) receives only what the dispatcher can start now.
    ``resync_after``: failed receives in a row before the client's settings are re-announced
    (0: never). ``stop_timeout``: the longest :meth:`ConsumeLoop.run` drains after a stop, a
    finite number of seconds (None: until every held message is settled;
    :meth:`ConsumeLoop.stop` can shorten it).
    """

    max_batch: int = MAX_BATCH
    prefetch: int = 0
    retry_backoff: Callable[[int], float] = exponential_backoff
    resync_after: int = 3
    ack_threads: int = 4
    stop_timeout: float | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.max_batch <= MAX_BATCH:
            raise ValueError(f"max_batch must be in [1, {MAX_BATCH}] (the proxy's batch limit), got {self.max_batch}")
        if self.prefetch < 0 or self.resync_after < 0:
            raise ValueError("prefetch and resync_after must be >= 0")
        if self.ack_threads < 1:
            raise ValueError(f"ack_threads must be >= 1, got {self.ack_threads}")
        if self.stop_timeout is not None:
            _finite_positive("stop_timeout", self.stop_timeout, allow_zero=True)
        require_plain(self.retry_backoff, "retry_backoff=")


class ConsumeKeywords(TypedDict, total=False):
    """The loop's flat keywords (each lands in one of the option groups)."""

    policy: Policy | str
    workers: int
    key: Callable[[Any], str | None] | None
    cost: Callable[[Any], float] | None
    dispatch_metrics: DispatchMetrics | None
    handler_timeout: float | None
    invisible_duration: float
    renew_margin: float | None
    hang_grace: float | None
    renew_threads: int
    max_batch: int
    prefetch: int
    retry_backoff: Callable[[int], float]
    resync_after: int
    ack_threads: int
    stop_timeout: float | None


_KEYWORD_GROUP: dict[str, tuple[str, str]] = {  # keyword -> (option group, field)
    "policy": ("dispatch", "policy"), "workers": ("dispatch", "workers"), "key": ("dispatch", "key"),
    "cost": ("dispatch", "cost"), "dispatch_metrics": ("dispatch", "metrics"),
    "handler_timeout": ("dispatch", "handler_timeout"),
    "invisible_duration": ("lease", "invisible_duration"), "renew_margin": ("lease", "renew_margin"),
    "hang_grace": ("lease", "hang_grace"), "renew_threads": ("lease", "renew_threads"),
    "max_batch": ("flow", "max_batch"), "prefetch": ("flow", "prefetch"), "retry_backoff": ("flow", "retry_backoff"),
    "resync_after": ("flow", "resync_after"), "ack_threads": ("flow", "ack_threads"),
    "stop_timeout": ("flow", "stop_timeout"),
}


def resolve_options(dispatch: DispatchOptions | None, lease: LeaseOptions | None, flow: FlowOptions | None,
                    keywords: dict[str, Any]) -> tuple[DispatchOptions, LeaseOptions, FlowOptions]:
    """The three groups with the flat ``keywords`` applied over them (each checked again)."""
    unknown = sorted(set(keywords) - set(_KEYWORD_GROUP))
    if unknown:
        raise TypeError(f"ConsumeLoop got unexpected keyword(s): {', '.join(unknown)}")
    changes: dict[str, dict[str, Any]] = {"dispatch": {}, "lease": {}, "flow": {}}
    for name, value in keywords.items():
        group, fname = _KEYWORD_GROUP[name]
        changes[group][fname] = value
    return (dataclasses.replace(dispatch or DispatchOptions(), **changes["dispatch"]),
            dataclasses.replace(lease or LeaseOptions(), **changes["lease"]),
            dataclasses.replace(flow or FlowOptions(), **changes["flow"]))
