"""Promise (costtable.py): a CostTable's keys and costs are checked (bad ones refused) and its
default is the median of its costs; the dataclass is frozen.

Steps: table = CostTable({"a": 1.0, "b": 3.0}); table.costs["z"] = -5.0; table.cost("z");
CostTable([("a", 1.0)]).

Expected: the costs cannot be changed behind the checks (TypeError), so table.cost never answers a
cost the table would refuse, and the default stays the median of what it holds. A costs= that is
not a mapping is a TypeError saying so.
Actual: costs is a plain dict: table.cost("z") is -5.0, and the default is stale; a list of pairs
is an AttributeError "'list' object has no attribute 'items'".
"""
from tracer.dispatch.costtable import CostTable

table = CostTable({"a": 1.0, "b": 3.0})
try:
    table.costs["z"] = -5.0  # type: ignore[index]
except TypeError:
    pass
assert table.cost("z") == table.default == 2.0, f"a cost outside the checks: {table.cost('z')}"
try:
    CostTable([("a", 1.0)])  # type: ignore[arg-type]
except TypeError as exc:
    print("refused:", exc)
except Exception as exc:  # noqa: BLE001
    raise SystemExit(f"CostTable(a list): {type(exc).__name__}: {exc}") from None
