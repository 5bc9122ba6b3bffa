"""Waiting for a 5.x client's settings before its first receive.

rocketmq-python-client 5.1.2: ``startup()`` returns before the proxy has sent the client its
settings, and a receive before they arrive fails (``InternalErrorException`` … ``"settings" is
null``, with a traceback in the consume loop's log: a first run that looks like a crash). The
client marks their arrival on ``_init_settings_event`` (5.1.2, ``rocketmq/v5/client/client.py``
``Client.__init__``; set by ``SimpleConsumer``/``PushConsumer``/``Producer`` on the first settings,
None after ``shutdown()``). Clients without it (the embedded broker, 2.x, a later client that
renames it) are not waited for.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ..bounds import timeout_s

__all__ = ["SETTINGS_ATTR", "SETTINGS_WAIT_S", "wait_for_settings"]

SETTINGS_ATTR = "_init_settings_event"  # rocketmq-python-client 5.1.2
# The client's own bound for a push consumer's first settings (client.py __init_routes: 10 s)
SETTINGS_WAIT_S = 10.0
_SLICE_S = 0.1  # how soon a stop is noticed while waiting


def wait_for_settings(client: Any, timeout: float | None = SETTINGS_WAIT_S,
                      stop: threading.Event | None = None) -> bool | None:
    """Wait until ``client`` has its settings: True once they arrived, False when ``timeout``
    passed or ``stop`` was set first, None when the client does not say (nothing to wait for).
    ``timeout`` None or ``math.inf``: no bound.

    Raises:
        ValueError: ``timeout`` is negative or NaN.
    """
    limit = timeout_s(timeout, "timeout")
    event = getattr(client, SETTINGS_ATTR, None)
    if event is None:  # a wrapper (TracedSimpleConsumer) around the client
        event = getattr(getattr(client, "wrapped", None), SETTINGS_ATTR, None)
    if not isinstance(event, threading.Event):
        return None
    if stop is None:
        return bool(event.wait(limit))
    deadline = None if limit is None else time.monotonic() + limit
    while not stop.is_set():
        left = _SLICE_S if deadline is None else deadline - time.monotonic()
        if event.wait(max(0.0, min(_SLICE_S, left))):
            return True
        if left <= 0:
            return False
    return bool(event.is_set())
