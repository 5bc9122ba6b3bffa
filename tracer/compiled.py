"""The per-message path compiled with mypyc: which modules, and which of them run compiled.

A message's CPU time follows the bytecode it runs more than its instruction count (BENCHMARKS.md;
docs/benchmarks-history.md, "Session 10"): the same modules compiled by mypyc cut a full trace from
1.3 to ~0.83 of a contrib-style span. ``python -m tracer.tools.compile DEST`` (``make compiled``)
builds the compiled copy (docs/settings.md, "Compiled build"). A compiled module enforces its
annotations at run time, so a public argument is typed as wide as what callers pass and checked by
the code; ``tests/test_compiled_build.py`` runs the message path's tests against a copy. The hints
below (:func:`mypyc_attr`) do nothing when the sources run. :func:`compiled_modules` names each
module that runs compiled and whether its source is newer (stale); ``rmqtrace bench overhead
--json`` records them.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Callable, TypeVar

__all__ = ["HOT_MODULES", "compiled_modules", "mypyc_attr"]

# What a message goes through, bottom up; each is mypy --strict clean and compiles as it is.
HOT_MODULES: tuple[str, ...] = (
    "tracer.path.clock",
    "tracer.path.stamps",
    "tracer.path.propagation",
    "tracer.telemetry.attributes",
    "tracer.telemetry.metrics",
    "tracer.telemetry.keep",
    "tracer.telemetry.spans",
    "tracer.telemetry.hold",
    "tracer.telemetry.tracercore",
    "tracer.telemetry.tracestate",
    "tracer.telemetry.tracer",
)

_T = TypeVar("_T")


def _no_hints(*_args: Any, **_kwargs: Any) -> Callable[[_T], _T]:
    """``mypyc_attr`` without mypy_extensions installed: a class left as it is (nothing compiles it)."""
    return lambda cls: cls


try:  # a hint to mypyc; the package does not depend on mypy_extensions
    from mypy_extensions import mypyc_attr
except ImportError:  # pragma: no cover - present wherever mypy is
    mypyc_attr = _no_hints


def compiled_modules() -> dict[str, bool]:
    """Each module of :data:`HOT_MODULES` imported compiled, and whether its ``.py`` is newer than
    the compiled file (stale: an edit it does not run)."""
    found: dict[str, bool] = {}
    for name in HOT_MODULES:
        module = sys.modules.get(name) or importlib.import_module(name)
        path = getattr(module, "__file__", None) or ""
        if path.endswith(".py"):
            continue
        source = os.path.join(os.path.dirname(path), name.rpartition(".")[2] + ".py")
        found[name] = os.path.exists(source) and os.path.getmtime(source) > os.path.getmtime(path)
    return found
