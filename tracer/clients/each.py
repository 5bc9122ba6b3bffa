"""One rule for a batch of broker calls on held messages (settles, a renewal pass): a
``BaseException`` raised inside one call (a Ctrl-C in the client's code, a ``SystemExit``) does not
cut the batch short. Every other message of the batch is still settled or renewed, then the first
such exception goes on to the caller — else the rest would stay held, or their leases lapse, until
someone called again (and a caller that was interrupted does not)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

__all__ = ["each_then_raise"]

T = TypeVar("T")


def each_then_raise(items: Iterable[T], call: Callable[[T], object]) -> int:
    """``call(item)`` for every item, also after one of them raised; then the first exception
    raised, if any, is raised again. Returns how many items were called."""
    first: BaseException | None = None
    n = 0
    for item in items:
        n += 1
        try:
            call(item)
        except BaseException as exc:  # noqa: BLE001 - raised again once the batch is done
            if first is None:
                first = exc
    if first is not None:
        try:
            raise first
        finally:
            first = None  # no reference cycle through this frame's traceback
    return n
