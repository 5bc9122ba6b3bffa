"""The package's layers and the other packages' internals it touches, read from the source.

Layers (tracer/__init__.py states them): a module imports only from its own layer or below, every
import counting (also those under ``TYPE_CHECKING`` or inside a function: a cycle hidden there is
still two modules that each need the other). Within a layer, no import cycle.

Internals: every private name of another package that the code reads or writes is listed in
``tracer.telemetry.internals`` (owner, written or read, versions), and every listed one exists in
the installed version, so an SDK upgrade that removes one fails here, not in a user's trace.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
from conftest import REPO

from tracer.telemetry.internals import INTERNALS, LEGACY

ROOT = REPO / "tracer"

# Bottom to top. A folder is one layer; the loose modules sit where their imports put them.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("tracer.version", "tracer.callables", "tracer.logonce", "tracer.argtypes", "tracer.bounds", "tracer.environ",
     "tracer.embedded"),
    ("tracer.path",),
    ("tracer.telemetry",),
    ("tracer.config",),
    ("tracer.dispatch",),
    ("tracer.clients",),
    ("tracer.instrumentor", "tracer.testing"),
    ("tracer.report",),
    ("tracer.tools", "tracer.__main__"),
)


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _layer(module: str) -> int:
    for rank, members in enumerate(LAYERS):
        if any(module == m or module.startswith(m + ".") for m in members):
            return rank
    raise AssertionError(f"{module} is in no layer: add it to LAYERS (and to tracer/__init__.py's list)")


def _imports(module: str) -> set[str]:
    path = MODULES[module]
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            name = ".".join(base + ([node.module] if node.module else []))
            for target in (name, *(f"{name}.{a.name}" for a in node.names)):
                if target in MODULES and target != module:
                    found.add(target)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in MODULES and a.name != module)
    return found


GRAPH = {m: _imports(m) for m in MODULES if m != "tracer"}  # the root re-exports every layer


def test_every_module_has_a_layer() -> None:
    for module in GRAPH:
        _layer(module)


def test_no_module_imports_a_layer_above_its_own() -> None:
    upward = sorted(f"{m} -> {t}" for m, targets in GRAPH.items() for t in targets
                    if t != "tracer" and _layer(t) > _layer(m))
    assert upward == []


def _is_package_of(a: str, b: str) -> bool:  # a package re-exporting its submodules is not a cycle
    return b.startswith(a + ".") or a.startswith(b + ".")


def _reaches(start: str, goal: str) -> bool:
    seen, todo = {start}, [start]
    while todo:
        for nxt in GRAPH.get(todo.pop(), ()):
            if nxt == goal:
                return True
            if nxt not in seen and not _is_package_of(nxt, goal):
                seen.add(nxt)
                todo.append(nxt)
    return False


def test_no_import_cycle() -> None:
    cycles = sorted(f"{m} -> {t}" for m, targets in GRAPH.items() for t in targets
                    if not _is_package_of(m, t) and _reaches(t, m))
    assert cycles == []  # fails before issue 31/33: clients.listener <-> official <-> probe; tools.cli <-> bench.report


def test_the_layer_order_is_stated_in_the_package_docstring() -> None:
    doc = importlib.import_module("tracer").__doc__ or ""
    folders = [members[0].rpartition(".")[2] for members in LAYERS[1:] if "." in members[0]
               and MODULES[members[0]].name == "__init__.py"]
    positions = [doc.find(f":mod:`tracer.{f}`") for f in folders]
    assert -1 not in positions and positions == sorted(positions), (folders, positions)


# --- other packages' internals ---------------------------------------------------------------

# Private names that are public API of their type (namedtuple, Enum) or our own, read through getattr.
_NOT_FOREIGN = {"_replace", "_value_", "_asdict", "_fields"}


def _own_names() -> set[str]:
    """Every attribute name defined by the package's own classes (assigned on self/cls, a class
    body's names, __slots__, function and class names)."""
    own: set[str] = set()
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                    and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                own.add(node.attr)
            elif isinstance(node, ast.ClassDef):
                pass
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    targets = item.targets if isinstance(item, ast.Assign) else \
                        [item.target] if isinstance(item, ast.AnnAssign) else []
                    for t in targets:
                        if isinstance(t, ast.Name):
                            own.add(t.id)
                            if t.id == "__slots__":
                                own.update(c.value for c in ast.walk(item) if isinstance(c, ast.Constant)
                                           and isinstance(c.value, str))
    return own


def _foreign_private_names() -> dict[str, list[str]]:
    own = _own_names()
    found: dict[str, list[str]] = {}
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = None
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                receiver = node.value
                if not (isinstance(receiver, ast.Name) and receiver.id in ("self", "cls")):
                    name = node.attr if node.attr not in own else None
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2:
                receiver, key = node.args[0], node.args[1]
                if isinstance(key, ast.Constant) and isinstance(key.value, str) and key.value.startswith("_") \
                        and not key.value.startswith("__") \
                        and not (isinstance(receiver, ast.Name) and receiver.id in ("self", "cls")):
                    name = key.value
            elif isinstance(node, ast.ImportFrom) and node.module and not node.module.startswith("tracer") \
                    and not node.level:
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.setdefault(alias.name, []).append(f"{module}:{node.lineno}")
            if name is not None and name not in _NOT_FOREIGN:
                found.setdefault(name, []).append(f"{module}:{node.lineno}")
    return found


def test_every_foreign_private_name_is_listed() -> None:
    listed = {i.name for i in INTERNALS}
    unlisted = {n: where for n, where in _foreign_private_names().items() if n not in listed}
    assert unlisted == {}, f"add these to tracer/telemetry/internals.py: {unlisted}"


def test_every_listed_internal_is_used() -> None:
    # read textually: names like _name or _lock are also our own classes' names, so the scan above
    # cannot tell every foreign use apart; a listed name nothing reads any more must go
    sources = "\n".join(p.read_text(encoding="utf-8") for m, p in MODULES.items()
                        if m != "tracer.telemetry.internals")
    stale = {i.name for i in INTERNALS if f".{i.name}" not in sources and f'"{i.name}"' not in sources}
    assert stale == set()


def _resolve(dotted: str) -> object:
    module, _, rest = dotted.partition(".")
    obj: object = importlib.import_module(module)
    for part in rest.split(".") if rest else []:
        try:
            obj = getattr(obj, part)
        except AttributeError:
            obj = importlib.import_module(f"{obj.__name__}.{part}")
    return obj


def _instance_of(owner: object) -> object:
    """An instance to look the name up on: instance attributes exist only there."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider, sampling

    name = getattr(owner, "__qualname__", "")
    if name == "TracerProvider":
        return TracerProvider()
    if name == "SynchronousMultiSpanProcessor":
        return TracerProvider()._active_span_processor
    if name == "ProxyTracer":
        return trace.ProxyTracer("rmqtrace.test", None, None)
    if name == "Tracer":
        return TracerProvider().get_tracer("rmqtrace.test")
    if name == "StaticSampler":
        return sampling.ALWAYS_ON
    if name == "ParentBased":
        return sampling.ParentBased(sampling.ALWAYS_ON)
    if name == "ReadableSpan":
        span = TracerProvider().get_tracer("rmqtrace.test").start_span("probe")
        span.end()
        return span
    if name == "OTLPSpanExporter":
        return owner()  # type: ignore[operator]
    if name == "BatchSpanProcessor":
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        return owner(InMemorySpanExporter())  # type: ignore[operator]
    return owner


@pytest.mark.parametrize("internal", INTERNALS, ids=lambda i: f"{i.owner.rpartition('.')[2]}.{i.name}")
def test_every_listed_internal_exists_in_the_installed_version(internal: object) -> None:
    from tracer.telemetry.internals import Internal

    assert isinstance(internal, Internal)
    if internal.versions == LEGACY:
        pytest.skip("the 2.x client lives in its own venv: tests/test_legacy_real.py reads it there")
    if internal.owner.startswith("rocketmq."):
        pytest.importorskip("rocketmq.v5.client")
        import inspect
        source = inspect.getsource(_resolve(internal.owner))  # type: ignore[arg-type]
        assert f"self.{internal.name}" in source
        return
    holder = _instance_of(_resolve(internal.owner))
    assert hasattr(holder, internal.name), f"{internal.owner}.{internal.name} is gone: {internal.without}"
