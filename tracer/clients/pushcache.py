"""Make a 5.x ``PushConsumer``'s cache visible to an :class:`~tracer.telemetry.occupancy.Occupancy`.

The push consumer caches up to 1024 messages per queue and feeds them to its thread pool; its
listener (:class:`~tracer.clients.official.TracedListener`) sees a message only when a pool thread
starts it, so received-but-not-started messages are invisible from there. The client calls its
public ``client_metrics.receive_after(group, messages)`` for every batch it receives, before
caching it: :func:`watch_push_cache` wraps that call on one consumer to announce each batch, and the
traced listener's later ``received`` consumes the announcement instead of counting twice.

Exact: receipts (per batch, at receive time), handler starts and ends (busy workers), so idle and
head-of-line worker-seconds. Not seen: a message the client drops from its cache without handing it
to the listener (a corrupted message, a queue taken away by rebalancing) stays counted as unstarted.
"""

from __future__ import annotations

from typing import Any, Callable

from ..telemetry.occupancy import Occupancy

__all__ = ["watch_push_cache"]


def watch_push_cache(consumer: Any, occupancy: Occupancy) -> Callable[[], None]:
    """Announce every batch ``consumer`` receives to ``occupancy``; returns the undo. Call before
    ``consumer.startup()``; pair it with ``MessageTracer(occupancy=occupancy)`` in its listener.

    Raises:
        TypeError: ``consumer`` has no ``client_metrics.receive_after`` (not a 5.x push consumer).
    """
    metrics = getattr(consumer, "client_metrics", None)
    received = getattr(metrics, "receive_after", None)
    if metrics is None or not callable(received):
        raise TypeError(f"{type(consumer).__name__} has no client_metrics.receive_after: not a 5.x PushConsumer")

    def receive_after(consumer_group: Any, messages: Any) -> Any:
        try:
            occupancy.announce(len(messages or ()))
        except Exception:  # noqa: BLE001 - counting must never stop the client's receive path
            pass
        return received(consumer_group, messages)

    metrics.receive_after = receive_after

    def undo() -> None:
        if metrics.receive_after is receive_after:
            metrics.receive_after = received

    return undo
