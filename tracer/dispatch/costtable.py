"""A cost table: each message key's handler seconds, learned from an earlier run, kept as JSON.

The seed's users run the same test suites again and again, so a test-case group's handler time is
known from the last run. ``rmqtrace report SPANS --costs costs.json`` writes the median handler
time of every message key the report read (:func:`learn_costs`); the producer's
:meth:`~tracer.clients.producer.TracedProducer.send_job` and the consume loop's ``cost_aware``
policy (through :func:`tracer.dispatch.cost.table_cost`) read it back with :func:`load_costs`.

The file, version 1::

    {"format": "rmqtrace.costs", "version": 1, "unit": "s",
     "costs": {"tg-0007": 3.912, "tg-0012": 0.031, ...}}

Unknown keys (a group added since the run) take the table's **median** cost: a new group is
assumed typical, neither sent first nor last. With ``group=`` (a function of a key, e.g. its suite
prefix) an unknown key takes the median of the known keys in its group first.

Safe to load from a file someone else wrote: JSON only (never pickle), at most
:data:`MAX_BYTES` and :data:`MAX_ENTRIES`, keys printable and at most :data:`MAX_KEY_CHARS`,
costs finite numbers in [0, :data:`MAX_COST_S`); anything else is refused with one
:class:`CostTableError` naming the file and the entry.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..callables import require_plain, unrun

__all__ = [
    "FORMAT",
    "MAX_BYTES",
    "MAX_COST_S",
    "MAX_ENTRIES",
    "MAX_KEY_CHARS",
    "VERSION",
    "CostTable",
    "CostTableError",
    "check_cost",
    "check_key",
    "learn_costs",
    "load_costs",
    "parse_costs",
]

FORMAT = "rmqtrace.costs"
VERSION = 1
MAX_BYTES = 8 * 1024 * 1024  # ~100 000 entries of short keys; a table is one line per key group
MAX_ENTRIES = 100_000
MAX_KEY_CHARS = 256
MAX_COST_S = 1e15  # the bound the consumer puts on a carried cost (tracer.path.propagation)


class CostTableError(ValueError):
    """A cost table that cannot be used: the message names the file (or "costs") and the entry."""


def check_cost(value: object, what: str) -> float:
    """``value`` as a cost in seconds, or :class:`CostTableError` saying ``what`` it was for.

    A cost is a real number (not a bool), finite, in [0, :data:`MAX_COST_S`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CostTableError(f"{what}: cost {value!r} is not a number")
    try:
        cost = float(value)
    except OverflowError:
        raise CostTableError(f"{what}: cost {value!r} is too large (at most {MAX_COST_S:g} s)") from None
    if math.isnan(cost) or cost < 0:
        raise CostTableError(f"{what}: cost {value!r} is not a number >= 0")
    if cost >= MAX_COST_S:
        raise CostTableError(f"{what}: cost {value!r} is too large (at most {MAX_COST_S:g} s)")
    return cost


def check_key(key: object, where: str) -> str:
    """``key`` if a table can hold it (a printable non-empty string of at most :data:`MAX_KEY_CHARS`)."""
    if not isinstance(key, str) or not key:
        raise CostTableError(f"{where}: key {key!r} is not a non-empty string")
    if len(key) > MAX_KEY_CHARS:
        raise CostTableError(f"{where}: key {key[:40]!r}… is longer than {MAX_KEY_CHARS} characters")
    if not key.isprintable():
        raise CostTableError(f"{where}: key {key[:40]!r} has unprintable characters")
    return key


@dataclass(frozen=True)
class CostTable:
    """Handler seconds by message key. Build one with :func:`learn_costs` or :func:`load_costs`.

    Raises:
        CostTableError: a bad key or cost, or more than :data:`MAX_ENTRIES` entries.
    """

    costs: Mapping[str, float]
    group: Callable[[str], str] | None = field(default=None, compare=False)
    _default: float = field(init=False, repr=False, compare=False)
    _groups: dict[str, float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        require_plain(self.group, "group=", optional=True)
        if len(self.costs) > MAX_ENTRIES:
            raise CostTableError(f"costs: {len(self.costs)} entries, more than {MAX_ENTRIES}")
        checked = {check_key(k, "costs"): check_cost(v, f"costs: entry {k!r}") for k, v in self.costs.items()}
        object.__setattr__(self, "costs", checked)
        object.__setattr__(self, "_default", statistics.median(checked.values()) if checked else 0.0)
        groups: dict[str, list[float]] = {}
        if self.group is not None:
            for k, v in checked.items():
                groups.setdefault(self._group_of(k), []).append(v)
        object.__setattr__(self, "_groups", {g: statistics.median(v) for g, v in groups.items()})

    @property
    def default(self) -> float:
        """The cost of an unknown key with no known group: the median of the table (0 when empty)."""
        return self._default

    def __len__(self) -> int:
        return len(self.costs)

    def __contains__(self, key: object) -> bool:
        return key in self.costs

    def cost(self, key: str | None) -> float:
        """``key``'s cost; an unknown key its group's median (with ``group=``), else :attr:`default`."""
        if key is None:
            return self._default
        known = self.costs.get(key)
        if known is not None:
            return known
        if self.group is not None:
            in_group = self._groups.get(self._group_of(key))
            if in_group is not None:
                return in_group
        return self._default

    def _group_of(self, key: str) -> str:
        """``group(key)``, refused loudly unless a str: a junk group (a returned coroutine, a new
        object per call) would match no known group, silently."""
        assert self.group is not None
        g = self.group(key)
        if not isinstance(g, str):
            raise CostTableError(f"group= returned {unrun(g) or type(g).__name__} for key {key!r}, not a str")
        return g

    def with_group(self, group: Callable[[str], str] | None) -> CostTable:
        """The same costs, unknown keys defaulting to their group's median under ``group``."""
        return CostTable(self.costs, group)

    def as_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "unit": "s", "costs": dict(sorted(self.costs.items()))}

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the table as JSON to ``path`` (atomically: a reader never sees half a file)."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(self.as_dict(), f, indent=0, allow_nan=False)
                f.write("\n")
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return target


def learn_costs(samples: Iterable[tuple[str | None, float]], *, group: Callable[[str], str] | None = None) -> CostTable:
    """The median handler seconds of each key over ``(key, seconds)`` samples (a key's runs across
    deliveries and earlier runs); samples without a key are left out.

    Raises:
        CostTableError: a bad key or duration (say which), or more than :data:`MAX_ENTRIES` keys.
    """
    require_plain(group, "group=", optional=True)
    by_key: dict[str, list[float]] = {}
    for key, seconds in samples:
        if key is None or key == "":
            continue
        by_key.setdefault(check_key(key, "samples"), []).append(check_cost(seconds, f"samples: key {key!r}"))
        if len(by_key) > MAX_ENTRIES:
            raise CostTableError(f"samples: more than {MAX_ENTRIES} keys")
    return CostTable({k: round(statistics.median(v), 6) for k, v in by_key.items()}, group)


def _refuse_constant(name: str) -> float:
    raise CostTableError(f"{name} is not a cost (JSON has no {name})")


def parse_costs(text: str | bytes, *, source: str = "costs", group: Callable[[str], str] | None = None) -> CostTable:
    """A table from the JSON text of a cost file; ``source`` names it in errors.

    Raises:
        CostTableError: too large, not JSON, not this format or version, or a bad entry (named).
    """
    require_plain(group, "group=", optional=True)
    if len(text) > MAX_BYTES:
        raise CostTableError(f"{source}: larger than {MAX_BYTES} bytes; not a cost table")
    try:
        doc = json.loads(text, parse_constant=_refuse_constant)
    except CostTableError as exc:
        raise CostTableError(f"{source}: {exc}") from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, bad UTF-8, nesting too deep
        raise CostTableError(f"{source}: not JSON ({str(exc)[:80]})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CostTableError(f"{source}: not a cost table (no \"format\": {FORMAT!r})")
    version = doc.get("version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise CostTableError(f"{source}: \"version\" {version!r} is not a whole number")
    if version != VERSION:
        newer = " (written by a newer rmqtrace)" if version > VERSION else ""
        raise CostTableError(f"{source}: version {version}{newer}; this rmqtrace reads version {VERSION}")
    if doc.get("unit", "s") != "s":
        raise CostTableError(f"{source}: unit {doc.get('unit')!r}; costs are in seconds (\"s\")")
    costs = doc.get("costs")
    if not isinstance(costs, dict):
        raise CostTableError(f"{source}: \"costs\" is not an object of key: seconds")
    if len(costs) > MAX_ENTRIES:
        raise CostTableError(f"{source}: {len(costs)} entries, more than {MAX_ENTRIES}")
    for key, value in costs.items():
        check_key(key, source)
        check_cost(value, f"{source}: entry {key!r}")
    return CostTable(costs, group)


def load_costs(path: str | os.PathLike[str], *, group: Callable[[str], str] | None = None) -> CostTable:
    """The cost table in the file at ``path`` (:func:`parse_costs`), read no further than
    :data:`MAX_BYTES`.

    Raises:
        CostTableError: unreadable, too large, or refused by :func:`parse_costs`.
    """
    require_plain(group, "group=", optional=True)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise CostTableError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return parse_costs(data, source=str(path), group=group)
