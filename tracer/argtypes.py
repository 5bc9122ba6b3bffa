"""argparse types for the ``rmqtrace`` commands: each names the rule it enforces. Below both
``tools/`` and ``report/`` (each command's parser uses them; the library never imports ``tools/``).

A bad value becomes argparse's one-line error and exit status 2, so every command checks its
arguments the same way before anything runs.
"""

from __future__ import annotations

import argparse
import math
from typing import Callable, TypeVar

__all__ = ["interval", "path", "port", "positive_number", "probability", "whole_at_least"]

N = TypeVar("N", int, float)


def _bounded(convert: Callable[[str], N], expected: str, ok: Callable[[N], bool],
             rule: Callable[[str, N], str], name: str) -> Callable[[str], N]:
    def parse(text: str) -> N:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(rule(text, value))
        return value
    parse.__name__ = name  # argparse names the type in "invalid <name> value" messages
    return parse


def whole_at_least(low: int) -> Callable[[str], int]:
    return _bounded(int, "a whole number", lambda v: v >= low, lambda t, v: f"must be >= {low}, got {v}",
                    f"int>={low}")


positive_number = _bounded(float, "a number", lambda v: math.isfinite(v) and v > 0,
                           lambda t, v: f"must be a number > 0, got {t!r}", "number>0")
interval = _bounded(float, "seconds", lambda v: math.isfinite(v) and v > 0,
                    lambda t, v: f"must be a number of seconds > 0, got {t!r}", "seconds>0")
port = _bounded(int, "a TCP port number", lambda v: 1 <= v <= 65535,
                lambda t, v: f"a TCP port is 1-65535, got {v}", "port")
probability = _bounded(float, "a probability", lambda v: 0.0 <= v <= 1.0,
                       lambda t, v: f"a probability is 0-1, got {t!r}", "probability")


def path(text: str) -> str:
    """A file or folder path: not empty. ``--costs "$OUT"`` with OUT unset gives "", which every
    ``if args.costs`` would read as "not asked" (nothing written, exit 0), and a positional SPANS
    "" as the default file."""
    if not text:
        raise argparse.ArgumentTypeError("expected a path, got an empty string")
    return text
