"""Write tests/semconv/registry.json from a checkout of open-telemetry/semantic-conventions.

    python tests/semconv/make_registry.py PATH/TO/semantic-conventions > tests/semconv/registry.json

Every attribute the registry defines (``groups[].attributes[].id`` and the ``definition/2`` files'
``attributes[].key``), with its type (an enum's type is its values' type), whether it is
deprecated and its stability; and every metric (``groups[]`` of ``type: metric``, by
``metric_name``, and the ``definition/2`` files' ``metrics[].name``) with its instrument, unit and
whether it is deprecated. tests/test_semconv_conformance.py checks our spans and OTel metrics
against it — the checks weaver's ``registry live-check`` makes of names, deprecation, types,
instruments and units, without weaver (no package registry here ships it; with a weaver binary,
tests/semconv/weaver_live_check.py runs the real check: see docs/semconv.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml


def attributes(model: Path) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for f in sorted(model.rglob("*.yaml")):
        doc = yaml.safe_load(f.read_text()) or {}
        defined = [a for g in doc.get("groups") or [] for a in g.get("attributes") or []]
        defined += doc.get("attributes") or []
        for a in defined:
            key = a.get("id") or a.get("key")
            if not key:
                continue  # a ref to an attribute defined elsewhere
            kind = a.get("type")
            if isinstance(kind, dict):
                values = [m.get("value") for m in kind.get("members", [])]
                kind = "int" if values and all(isinstance(v, int) for v in values) else "string"
            out[key] = {"type": kind, "deprecated": bool(a.get("deprecated")), "stability": a.get("stability")}
    return dict(sorted(out.items()))


def metrics(model: Path) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for f in sorted(model.rglob("*.yaml")):
        doc = yaml.safe_load(f.read_text()) or {}
        defined = [(g.get("metric_name"), g) for g in doc.get("groups") or [] if g.get("type") == "metric"]
        defined += [(m.get("name"), m) for m in doc.get("metrics") or []]
        for name, m in defined:
            if name:
                out[name] = {"instrument": m.get("instrument"), "unit": m.get("unit"),
                             "deprecated": bool(m.get("deprecated"))}
    return dict(sorted(out.items()))


def main(checkout: str) -> None:
    root = Path(checkout)
    commit = subprocess.run(["git", "-C", str(root), "describe", "--tags", "--long"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    model = root / "model"
    sys.stdout.write(dump(f"open-telemetry/semantic-conventions {commit}", attributes(model), metrics(model)))


def dump(source: str, attrs: dict[str, dict[str, Any]], metrics: dict[str, dict[str, Any]]) -> str:
    """One attribute (one metric) a line, so a regenerated file diffs by entry."""

    def block(entries: dict[str, dict[str, Any]]) -> str:
        return ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in entries.items())

    return (f'{{"source": {json.dumps(source)},\n "attributes": {{\n{block(attrs)}\n}},\n'
            f' "metrics": {{\n{block(metrics)}\n}}}}\n')


if __name__ == "__main__":
    main(sys.argv[1])
