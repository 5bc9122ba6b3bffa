"""Which child spans a ``process`` span should have: the handler and every gap with a length (an
empty gap gets no span; docs/semconv.md), read from its own ``rmqtrace.stamp.*`` attributes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tracer.path.names import GAP_SPANS, STAMP_ATTRS
from tracer.path.stamps import Stamps, causal


def expected_children(attributes: Mapping[str, Any]) -> list[str]:
    """Sorted names: ``handler`` and the gap spans whose causal stamps are apart."""
    stamps = Stamps()
    for stage, key in STAMP_ATTRS.items():
        if key in attributes:
            stamps.times[stage] = int(attributes[key])
    c = causal(stamps.times)
    return sorted(["handler", *(g.name for g in GAP_SPANS if c[g.start] and c[g.end] > c[g.start])])
