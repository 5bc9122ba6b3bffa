"""The one place rmqtrace reads its settings from the process environment.

:func:`environment` takes a snapshot of the ``RMQTRACE_*`` and ``OTEL_*`` variables; every parser
(:meth:`tracer.config.Settings.from_env`, :meth:`tracer.telemetry.tracerconfig.TracerConfig.from_env`,
:meth:`tracer.telemetry.keep.KeepPolicy.from_env`, ...) reads a mapping, this one unless given
another, so a test hands it a dict and no code reads a variable behind the parsers' back
(``tests/test_environ.py`` fails on a read anywhere else). Called at entry points, never at import.
"""

from __future__ import annotations

import os
from typing import Mapping

__all__ = ["PREFIXES", "environment"]

PREFIXES = ("RMQTRACE_", "OTEL_")  # the variables rmqtrace reads (and the SDK's it interprets)


def environment() -> Mapping[str, str]:
    """The ``RMQTRACE_*`` and ``OTEL_*`` variables now, as a new dict (later changes do not reach it)."""
    return {k: v for k, v in os.environ.items() if k.startswith(PREFIXES)}
