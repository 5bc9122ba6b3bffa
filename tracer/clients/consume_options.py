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
import numbers
from dataclasses import dataclass
from typing import Any, Callable, TypedDict

from .. import bounds
from ..bounds import MAX_THREADS, count, seconds, timeout_s
from ..callables import require_plain, unrun
from ..dispatch import DispatchMetrics, Policy

__all__ = [
    "MAX_BATCH",
    "MAX_INVISIBLE_S",
    "MIN_INVISIBLE_S",
    "MIN_RENEW_MARGIN_S",
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
# The lease keeper looks at the leases every margin / 3 seconds, but never more often than every
# MIN_RENEW_MARGIN_S / 3: a shorter margin would be due only between two of its looks, and the
# lease of a running handler would run out unrenewed. (Its renewal, one broker round trip, must
# fit in the margin too.)
MIN_RENEW_MARGIN_S = 0.15
MAX_PREFETCH = 1_000_000  # messages held ahead; the 5.x push consumer caches 1024 per queue
_MAX_BACKOFF_EXPONENT = 64  # 2**64 s is beyond any cap; beyond it 2.0**n overflows (n >= 1024)


def whole_seconds(seconds: float) -> int:
    """What the broker is told: RocketMQ counts invisibility in whole seconds, and the 5.x client
    rejects anything but an ``int`` (a float fails every receive and every lease renewal).

    Raises:
        ValueError: ``seconds`` is not a finite number."""
    return max(1, math.ceil(bounds.seconds(seconds, "seconds", minimum=-math.inf)))


def exponential_backoff(attempt: int, base: float = 1.0, cap: float = 60.0) -> float:
    """Seconds until a failed delivery comes back: 1, 2, 4 … capped (any attempt, however large).

    Raises:
        ValueError: ``attempt`` not an int; ``base`` or ``cap`` not a finite number >= 0.
    """
    count(attempt, "attempt", minimum=-(2**63))  # any int: below 1 counts as the first
    base = seconds(base, "base", above=False)
    cap = seconds(cap, "cap", above=False)
    exponent = min(max(0, attempt - 1), _MAX_BACKOFF_EXPONENT)
    return float(min(cap, base * (2.0**exponent)))


def backoff_seconds(fn: Callable[[int], object], attempt: int) -> tuple[float, str | None]:
    """``fn(attempt)`` as seconds the broker accepts, and what was wrong with the answer (None: nothing).

    A ``retry_backoff=`` is the user's: its failure must cost neither the message's give-back nor
    the loop. An ``Exception`` from it, or an answer that is no number (NaN, a str, a bool, a
    returned coroutine — closed here), takes :func:`exponential_backoff`; a number past the
    longest lease the broker grants (``math.inf``, ``10**400``, ``1e9``) is that longest,
    :data:`MAX_INVISIBLE_S`; a negative one is 0 (the broker then gives the shortest, 1 s).
    A ``BaseException`` (Ctrl-C) propagates: the caller gives the message back, then stops.
    """
    try:
        answer = fn(attempt)
    except Exception as exc:  # noqa: BLE001 - the user's backoff: its failure is contained here
        return exponential_backoff(attempt), f"raised {type(exc).__name__}: {exc}"
    kind = unrun(answer)
    if kind is not None or not isinstance(answer, numbers.Real) or isinstance(answer, bool):
        return exponential_backoff(attempt), f"returned {kind or type(answer).__name__}, not seconds"
    try:
        value = float(answer)
    except OverflowError:  # an int too large for a float: past any lease
        value = 0.0 if answer <= 0 else math.inf
    except Exception as exc:  # noqa: BLE001 - a user's numbers.Real whose __float__ fails
        return exponential_backoff(attempt), f"returned {type(answer).__name__} that is no float ({exc})"
    if math.isnan(value):
        return exponential_backoff(attempt), "returned NaN, not seconds"
    if value > MAX_INVISIBLE_S:
        return MAX_INVISIBLE_S, f"returned {value:g} s, past the broker's longest ({MAX_INVISIBLE_S:g} s)"
    return max(0.0, value), None


def _callable_or_none(name: str, fn: object) -> None:
    require_plain(fn, f"{name}=", optional=True)


@dataclass(frozen=True)
class DispatchOptions:
    """How received messages run: passed to the loop's :class:`~tracer.dispatch.Dispatcher`.

    ``handler_timeout``: seconds > 0; None, ``math.inf`` or one past what a thread can wait for
    (:data:`tracer.bounds.NO_BOUND_S`) is no timeout, and is stored as None.
    """

    policy: Policy | str = "aggressive"
    workers: int = 8
    key: Callable[[Any], str | None] | None = None
    cost: Callable[[Any], float] | None = None
    metrics: DispatchMetrics | None = None
    handler_timeout: float | None = None

    def __post_init__(self) -> None:
        count(self.workers, "workers", maximum=MAX_THREADS)
        # stored as the loop uses it: math.inf or a huge one is no watchdog, as None
        object.__setattr__(self, "handler_timeout", timeout_s(self.handler_timeout, "handler_timeout", positive=True))
        _callable_or_none("key", self.key)
        _callable_or_none("cost", self.cost)


@dataclass(frozen=True)
class LeaseOptions:
    """How long the broker keeps a held message invisible, and when the loop renews or gives up.

    ``invisible_duration``: seconds per lease, at least 1 (RocketMQ grants whole seconds; a
    fraction is rounded up for the broker while the loop keeps the exact value as its own,
    earlier, deadline; the proxy refuses receives below its ``minInvisibleTimeMillsForRecv``,
    10 s by default, and leases above 12 h). ``renew_margin``: renew when less than this is
    left (default a third of the lease; at least ``MIN_RENEW_MARGIN_S``, 0.15 s). ``hang_grace``: a handler still running
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
        # the broker grants whole seconds, and refuses longer leases
        seconds(self.invisible_duration, "invisible_duration", minimum=MIN_INVISIBLE_S, above=False,
                maximum=MAX_INVISIBLE_S)
        if self.renew_margin is not None:
            seconds(self.renew_margin, "renew_margin", minimum=MIN_RENEW_MARGIN_S, above=False)
            if not self.renew_margin < self.invisible_duration:
                raise ValueError(f"renew_margin must be below invisible_duration={self.invisible_duration:g}, "
                                 f"got {self.renew_margin}")
        if self.hang_grace is not None:
            seconds(self.hang_grace, "hang_grace", above=False)
        count(self.renew_threads, "renew_threads", maximum=MAX_THREADS)

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
    (0: never). ``receive_ahead``: also receive for a running handler expected to end within one
    receive round trip, by its cost (:mod:`tracer.clients.ahead`; not with ``prefetch``).
    ``retry_backoff(delivery_attempt)``: seconds a failed or given-back message stays
    invisible; a raising or junk one is contained (:func:`backoff_seconds`). ``stop_timeout``:
    the longest :meth:`ConsumeLoop.run` drains after a stop, in seconds (None or ``math.inf``:
    until every held message is settled; :meth:`ConsumeLoop.stop` can shorten it).
    """

    max_batch: int = MAX_BATCH
    prefetch: int = 0
    retry_backoff: Callable[[int], float] = exponential_backoff
    resync_after: int = 3
    ack_threads: int = 4
    stop_timeout: float | None = None
    receive_ahead: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.receive_ahead, bool):
            raise TypeError(f"receive_ahead must be a bool, got {type(self.receive_ahead).__name__}")
        count(self.max_batch, "max_batch (the proxy's batch limit)", maximum=MAX_BATCH)
        # what prefetch is comes first: a NaN one must be named as such, not blamed on receive_ahead
        count(self.prefetch, "prefetch", minimum=0, maximum=MAX_PREFETCH)
        if self.receive_ahead and self.prefetch:
            raise ValueError(f"receive_ahead cannot work with prefetch={self.prefetch}: a prefetch "
                             "buffer already receives ahead, for workers that are not about to free")
        count(self.resync_after, "resync_after", minimum=0)
        count(self.ack_threads, "ack_threads", maximum=MAX_THREADS)
        # stored as the loop uses it: math.inf or a huge one is no bound, as None
        object.__setattr__(self, "stop_timeout", timeout_s(self.stop_timeout, "stop_timeout"))
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
    receive_ahead: bool


_KEYWORD_GROUP: dict[str, tuple[str, str]] = {  # keyword -> (option group, field)
    "policy": ("dispatch", "policy"), "workers": ("dispatch", "workers"), "key": ("dispatch", "key"),
    "cost": ("dispatch", "cost"), "dispatch_metrics": ("dispatch", "metrics"),
    "handler_timeout": ("dispatch", "handler_timeout"),
    "invisible_duration": ("lease", "invisible_duration"), "renew_margin": ("lease", "renew_margin"),
    "hang_grace": ("lease", "hang_grace"), "renew_threads": ("lease", "renew_threads"),
    "max_batch": ("flow", "max_batch"), "prefetch": ("flow", "prefetch"), "retry_backoff": ("flow", "retry_backoff"),
    "resync_after": ("flow", "resync_after"), "ack_threads": ("flow", "ack_threads"),
    "stop_timeout": ("flow", "stop_timeout"), "receive_ahead": ("flow", "receive_ahead"),
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
