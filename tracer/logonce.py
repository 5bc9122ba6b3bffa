"""The one way rmqtrace reports its own failures: the first of each kind loudly, later ones quietly.

rmqtrace runs inside other people's consumers, so a failure of its own code (a hook, an exporter,
a user's ``cost=`` callable) must never stop the message flow, and must not flood their logs
either. Every place that swallows such a failure goes through a :class:`OnceLogger`; a warning
meant for the caller's line (a deprecation) takes its ``stacklevel`` from :func:`outside_stacklevel`.
"""

from __future__ import annotations

import inspect
import logging
import os
import threading

__all__ = ["OnceLogger", "outside_stacklevel"]

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def outside_stacklevel() -> int:
    """``warnings.warn``'s ``stacklevel``, for the function calling this one, that names the first
    line outside rmqtrace: a fixed count is wrong in the compiled build (tracer.compiled), whose
    compiled functions have no Python frames of their own."""
    here = inspect.currentframe()
    frame = here.f_back if here is not None else None  # the warner's, or (compiled) the nearest above it
    level = 1
    while frame is not None and frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
        level += 1
    return level


class OnceLogger:
    """Logs the first failure of each kind with its traceback; later ones of that kind at debug level.

    ``where`` names the owner in every line (``"dispatcher 'orders'"``). Thread-safe: two threads
    failing the same way at once still log the first one once.
    """

    __slots__ = ("_level", "_lock", "_logger", "_seen", "_where")

    def __init__(self, where: str, logger: logging.Logger, level: int = logging.ERROR) -> None:
        self._where = where
        self._logger = logger
        self._level = level
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, kind: str, exc: BaseException | None = None, detail: str = "") -> bool:
        """Log ``kind``'s failure; returns True when this was the first of its kind."""
        with self._lock:
            first = kind not in self._seen
            self._seen.add(kind)
        suffix = f": {detail}" if detail else ""
        if first:
            self._logger.log(self._level, "%s: %s failed%s (logged once; later ones at debug level)",
                             self._where, kind, suffix, exc_info=exc)
        else:
            self._logger.debug("%s: %s failed again%s: %r", self._where, kind, suffix, exc)
        return first

    def seen(self, kind: str) -> bool:
        return kind in self._seen
