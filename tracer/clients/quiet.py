"""Importing the 5.x client without touching the user's home directory (for tools and tests)."""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from typing import Any

__all__ = ["import_quietly"]


def import_quietly() -> Any:
    """``import rocketmq`` (5.x) without its import-time side effects on the user's home: the
    client creates ``~/logs/rocketmq_python`` and attaches a file handler when first imported.
    For tools and tests; applications import the client as they always do."""
    if "rocketmq" not in sys.modules:
        home = os.environ.get("HOME")
        os.environ["HOME"] = tempfile.mkdtemp(prefix="rmqtrace-client-")
        try:
            import rocketmq  # noqa: F401
        finally:
            if home is None:
                del os.environ["HOME"]
            else:
                os.environ["HOME"] = home
        lg = logging.getLogger("rocketmq-python-client")
        for h in list(lg.handlers):
            lg.removeHandler(h)
            h.close()
        lg.addHandler(logging.NullHandler())
        lg.setLevel(logging.WARNING)
    import rocketmq

    return rocketmq
