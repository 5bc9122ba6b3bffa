"""Issue 31 item 2's siblings: every reader of time on the consumer, dispatcher, blame, hold and keep
path reads one of the two timelines of tracer/path/clock.py by its type — the wall clock
(``WallClock``/``WallNs``) for stamps, the monotonic clock (``MonotonicClock``/``MonoNs``) for ages,
leases and deadlines — so ``mypy --strict`` refuses a mix (tests/test_clock.py runs it on one), and
none reads the system clock behind the injected one's back (a manual clock in a test, or the
tracer's clock shared with hold, keep and occupancy, would then be another timeline).

Both checks discover what they check from the source: every module of the packages on the path,
every public function and method (named in ``__all__``) with a parameter that takes a clock or a
reading of one."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "tracer"
PATH_PACKAGES = ("clients", "dispatch", "telemetry", "path")
MODULES = sorted(p.relative_to(ROOT.parent).as_posix() for pkg in PATH_PACKAGES for p in (ROOT / pkg).glob("*.py"))

SYSTEM_CLOCKS = {"time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns", "now", "utcnow"}

# Direct reads of the system clock that are no measurement on a message's path, with why.
DIRECT_READS = {
    ("tracer/path/clock.py", "time_ns"): "SystemClock is the wall clock",
    ("tracer/path/clock.py", "monotonic_ns"): "SystemClock is the monotonic clock",
    ("tracer/dispatch/core.py", "monotonic_ns"): "the dispatcher's default clock when none is given",
    ("tracer/telemetry/metrics.py", "time"): "an exemplar's timestamp is Prometheus' wall time, never a test clock's",
    ("tracer/clients/startup.py", "monotonic"): "bounds a real wait for the client's settings (Event.wait)",
    ("tracer/clients/consume.py", "monotonic"): "the loop's default clock, and stop()'s bound on real thread waits",
    ("tracer/clients/consume.py", "time"): "the loop's default wall clock (leases dated from the broker's pop time)",
    ("tracer/clients/probe.py", "monotonic"): "the probe sender's default pacing clock",
    ("tracer/telemetry/exportchild.py", "monotonic"):
        "bounds real process and thread waits (shutdown, the child's restart delay), no message's time",
}

TIME_PARAM = re.compile(r"^(clock|monotonic|wall|now|now_ns|mono_ns|wall_ns|since|deadline|end_mono)$|_mono$")
TYPED = re.compile(r"\b(WallClock|MonotonicClock|Clock|WallNs|MonoNs)\b")
# the consume loop's lease and pacing timers are float seconds from callables of its own, not the
# tracer's typed clocks (tracer/clients/consume.py, lease.py: the consume loop's modules)
FLOAT_SECONDS = {"tracer/clients/consume.py", "tracer/clients/lease.py", "tracer/clients/probe.py"}
NOT_READERS = {("tracer/path/clock.py", "require_clock"): "checks an object that may be no clock at all"}


def _direct_reads(module: str) -> set[str]:
    tree = ast.parse((ROOT.parent / module).read_text())
    aliases = {a.asname or a.name: a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
               and n.module in ("time", "datetime") for a in n.names}
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in SYSTEM_CLOCKS and isinstance(node.value, ast.Name) \
                and node.value.id in ("time", "datetime", "_dt", "_time"):
            found.add(node.attr)
        elif isinstance(node, ast.Attribute) and node.attr in ("now", "utcnow") and "datetime" in ast.unparse(node.value):
            found.add(node.attr)
        elif isinstance(node, ast.Name) and aliases.get(node.id) in SYSTEM_CLOCKS:
            found.add(aliases[node.id])
    return found


@pytest.mark.parametrize("module", MODULES)
def test_no_reader_on_the_path_reads_the_system_clock_behind_its_clock(module: str) -> None:
    found = _direct_reads(module)
    unexplained = {f for f in found if (module, f) not in DIRECT_READS}
    assert not unexplained, f"{module} reads time.{'/'.join(sorted(unexplained))}: read the injected clock"
    stale = {f for (m, f) in DIRECT_READS if m == module and f not in found}
    assert not stale, f"DIRECT_READS names reads {module} no longer makes: {stale}"


def _public_time_params() -> list[tuple[str, str, str, str | None]]:
    out = []
    for module in MODULES:
        tree = ast.parse((ROOT.parent / module).read_text())
        exported: set[str] = set()
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
                exported = {ast.literal_eval(e) for e in node.value.elts}  # type: ignore[attr-defined]
        funcs: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in exported:
                funcs.append((node.name, node))
            elif isinstance(node, ast.ClassDef) and node.name in exported:
                funcs += [(f"{node.name}.{f.name}", f) for f in node.body
                          if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                          and (not f.name.startswith("_") or f.name == "__init__")]
        for name, f in funcs:
            if (module, name) in NOT_READERS:
                continue
            for a in f.args.posonlyargs + f.args.args + f.args.kwonlyargs:
                if TIME_PARAM.search(a.arg):
                    out.append((module, name, a.arg, ast.unparse(a.annotation) if a.annotation else None))
    return out


PARAMS = _public_time_params()


@pytest.mark.parametrize(("module", "function", "param", "annotation"), [
    pytest.param(*p, id=f"{p[0].split('/')[-1]}:{p[1]}:{p[2]}",
                 marks=[pytest.mark.xfail(strict=True, reason="the consume loop's own float-second clock")]
                 if p[0] in FLOAT_SECONDS and not TYPED.search(p[3] or "") else [])
    for p in PARAMS])
def test_every_public_time_parameter_names_its_timeline(module: str, function: str, param: str,
                                                        annotation: str | None) -> None:
    assert annotation is not None and TYPED.search(annotation), (
        f"{module} {function}({param}: {annotation}): a wall or monotonic clock type, so mypy refuses the other")


def test_the_discovery_sees_the_path() -> None:
    names = {(m.split("/")[-1], f, p) for m, f, p, _ in PARAMS}
    assert {("hold.py", "HoldingSpanProcessor.tick", "now_ns"), ("keep.py", "KeepPolicy.decide", "end_mono"),
            ("engine.py", "Dispatcher.__init__", "clock"), ("tracercore.py", "TracerCore.__init__", "clock")} <= names
