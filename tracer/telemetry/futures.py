"""The outcome of a finished ``concurrent.futures.Future``, for a done-callback.

``Future.exception()`` raises ``CancelledError`` on a cancelled future (what
``asyncio.wait_for(asyncio.wrap_future(f), t)`` does on timeout) instead of returning it: a
done-callback that calls it dies there, inside ``concurrent.futures``' "exception calling
callback" log, and whatever it was to end (a span, a duration point) never ends. Every
done-callback of ours reads the outcome here, so a cancelled future ends as a failure too.
"""

from __future__ import annotations

from concurrent.futures import CancelledError, Future
from typing import Any

__all__ = ["future_error"]


def future_error(f: Future[Any]) -> BaseException | None:
    """The exception ``f`` ended with, a ``CancelledError`` if it was cancelled, else ``None``.
    ``f`` must be done (a done-callback's argument is)."""
    if f.cancelled():
        return CancelledError()
    return f.exception()
