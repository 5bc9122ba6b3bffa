"""Write tests/semconv/registry-attributes.json from a checkout of open-telemetry/semantic-conventions.

    python tests/semconv/make_registry.py PATH/TO/semantic-conventions > tests/semconv/registry-attributes.json

Every attribute the registry defines (``groups[].attributes[].id`` and the ``definition/2`` files'
``attributes[].key``), with its type (an enum's type is its values' type), whether it is
deprecated and its stability. tests/test_semconv_conformance.py checks our spans against it — the
checks weaver's ``registry live-check`` makes of names, deprecation and types, without weaver
(no registry here ships it; see docs/semconv.md).
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


def main(checkout: str) -> None:
    root = Path(checkout)
    commit = subprocess.run(["git", "-C", str(root), "describe", "--tags", "--long"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    sys.stdout.write(dump(f"open-telemetry/semantic-conventions {commit}", attributes(root / "model")))


def dump(source: str, attrs: dict[str, dict[str, Any]]) -> str:
    """One attribute a line, so a regenerated file diffs by attribute."""
    lines = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in attrs.items()]
    return f'{{"source": {json.dumps(source)},\n "attributes": {{\n' + ",\n".join(lines) + "\n}}\n"


if __name__ == "__main__":
    main(sys.argv[1])
