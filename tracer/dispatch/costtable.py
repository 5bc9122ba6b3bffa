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

Safe to load from a file someone else wrote: a regular file (not a FIFO or a device), JSON only
(never pickle), at most :data:`MAX_BYTES` and :data:`MAX_ENTRIES`, each key once, printable and
at most :data:`MAX_KEY_CHARS`, costs finite numbers in [0, :data:`MAX_COST_S`); anything else is
refused with one :class:`CostTableError` naming the file and the entry. What :meth:`CostTable.save`
writes is always loadable: a table whose JSON would exceed :data:`MAX_BYTES` is refused there.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import secrets
import stat
import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ..callables import require_plain, short_repr, unrun

__all__ = [
    "FORMAT",
    "MAX_BYTES",
    "MAX_COST_S",
    "MAX_ENTRIES",
    "MAX_KEY_CHARS",
    "VERSION",
    "CostTable",
    "CostTableError",
    "as_seconds",
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
MAX_KEY_CHARS = 256  # = the cap on a recorded message key (tracer.telemetry.attributes.MAX_ATTR_CHARS)
MAX_COST_S = 1e15  # the bound the consumer puts on a carried cost (tracer.path.propagation)


class CostTableError(ValueError):
    """A cost table that cannot be used: the message names the file (or "costs") and the entry."""


def as_seconds(value: object) -> float | None:
    """``value`` as a finite float >= 0, or None when it cannot be one: the one rule of what a cost
    is, for the dispatcher's ``cost=`` (a hint: None there is cost 0) and for a table (refused).

    Any real number but a bool is taken (int, float, Fraction, numpy scalars: ``numbers.Real``);
    the conversion itself may raise (an int too large for a float, a user's ``__float__``)."""
    if value.__class__ is float:  # the usual: no conversion
        f: float = value
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        try:
            f = float(value)
        except Exception:  # noqa: BLE001 - a number that cannot be a float is no cost
            return None
    else:
        return None
    return f if math.isfinite(f) and f >= 0 else None


def check_cost(value: object, what: str) -> float:
    """``value`` as a cost in seconds, or :class:`CostTableError` saying ``what`` it was for.

    A cost is a real number (:func:`as_seconds`: not a bool), finite, in [0, :data:`MAX_COST_S`)."""
    cost = as_seconds(value)
    if cost is not None and cost < MAX_COST_S:
        return cost
    shown = short_repr(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise CostTableError(f"{what}: cost {shown} is not a number")
    if cost is not None or _too_large(value):
        raise CostTableError(f"{what}: cost {shown} is too large (at most {MAX_COST_S:g} s)")
    raise CostTableError(f"{what}: cost {shown} is not a number >= 0")


def _too_large(value: Any) -> bool:
    """A real that is no float because it is too large (``10**400``, ``inf``), not NaN nor negative."""
    try:
        return bool(value > 0) and not math.isnan(float(value))
    except OverflowError:
        return True
    except Exception:  # noqa: BLE001 - a user's number that cannot compare or convert
        return False


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
        if not isinstance(self.costs, Mapping):
            raise TypeError(f"costs must be a mapping of key: seconds, got {type(self.costs).__name__}")
        if len(self.costs) > MAX_ENTRIES:
            raise CostTableError(f"costs: {len(self.costs)} entries, more than {MAX_ENTRIES}")
        checked = {check_key(k, "costs"): check_cost(v, f"costs: entry {k!r}") for k, v in self.costs.items()}
        # read-only: a cost put in behind the checks would reach send_job and cost_aware unchecked,
        # and the default (the median) would no longer be the median of what the table holds
        object.__setattr__(self, "costs", MappingProxyType(checked))
        object.__setattr__(self, "_default", statistics.median(checked.values()) if checked else 0.0)
        groups: dict[str, list[float]] = {}
        if self.group is not None:
            for k, v in checked.items():
                groups.setdefault(self._group_of(k), []).append(v)
        object.__setattr__(self, "_groups", {g: statistics.median(v) for g, v in groups.items()})

    def __reduce__(self) -> tuple[Any, ...]:
        """Rebuilt (and checked again) from its costs: a read-only mapping does not pickle, and a
        table may be handed to another process (a pool's worker, a copy)."""
        return (CostTable, (dict(self.costs), self.group))

    @property
    def default(self) -> float:
        """The cost of an unknown key with no known group: the median of the table (0 when empty)."""
        return self._default

    def __len__(self) -> int:
        return len(self.costs)

    def __contains__(self, key: object) -> bool:
        return key in self.costs

    def cost(self, key: str | None) -> float:
        """``key``'s cost; an unknown key its group's median (with ``group=``), else :attr:`default`.
        A key over :data:`MAX_KEY_CHARS` is read by its first :data:`MAX_KEY_CHARS` characters."""
        if key is None:
            return self._default
        if len(key) > MAX_KEY_CHARS:
            # read as a span recorded it: capped at MAX_KEY_CHARS (semconv.md), which is what a table
            # learned from the spans holds for it; the whole key would miss that entry for ever
            key = key[:MAX_KEY_CHARS]
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
        try:
            g = self.group(key)
        except Exception as exc:  # noqa: BLE001 - said as group='s, with the key it failed on
            raise CostTableError(f"group= raised {type(exc).__name__} for key {key!r}: {exc}") from exc
        if not isinstance(g, str):
            raise CostTableError(f"group= returned {unrun(g) or type(g).__name__} for key {key!r}, not a str")
        return g

    def with_group(self, group: Callable[[str], str] | None) -> CostTable:
        """The same costs, unknown keys defaulting to their group's median under ``group``."""
        return CostTable(self.costs, group)

    def as_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "unit": "s", "costs": dict(sorted(self.costs.items()))}

    def to_json(self) -> str:
        """The file's text; :class:`CostTableError` when it is longer than a loader reads
        (:data:`MAX_BYTES`): what is written is always what :func:`load_costs` takes back."""
        text = json.dumps(self.as_dict(), indent=0, allow_nan=False) + "\n"
        size = len(text.encode("utf-8"))
        if size > MAX_BYTES:
            raise CostTableError(f"costs: {len(self.costs)} keys make {size} bytes of JSON, more than the "
                                 f"{MAX_BYTES} a loader reads; learn fewer or shorter keys (--group, --job)")
        return text

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the table as JSON to ``path``: a regular file is replaced atomically (a reader never
        sees half a file), through a symlink to it (the link stays), keeping its mode (a new one
        0666 & ~umask, as any write); anything else the path names (``/dev/stdout``, a pipe) is
        written to as it is.

        Raises:
            CostTableError: the table is larger than a loader reads (:meth:`to_json`); nothing is written.
            OSError: the file cannot be written.
        """
        text = self.to_json()
        target = Path(path)
        try:
            mode: int | None = os.stat(target).st_mode
        except FileNotFoundError:
            mode = None
        if mode is not None and not stat.S_ISREG(mode):
            with open(target, "w", encoding="utf-8") as out:
                out.write(text)
            return target
        real = Path(os.path.realpath(target))  # a symlink's target is replaced, not the link
        real.parent.mkdir(parents=True, exist_ok=True)
        # not mkstemp: its 0600 would stay on the table, unreadable to a producer run as another
        # user; created 0666 & ~umask like any other write, an existing file's mode kept
        tmp = str(real.parent / f".{real.name}.{secrets.token_hex(6)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                if mode is not None:
                    os.fchmod(f.fileno(), stat.S_IMODE(mode))
                f.write(text)
            os.replace(tmp, real)
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


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refused when a key appears twice: json.loads would keep the last value, so
    a table could say one cost for a key and mean another."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise CostTableError(f"duplicate key {key[:40]!r} (a key appears once in a cost table)")
        out[key] = value
    return out


def parse_costs(text: str | bytes, *, source: str = "costs", group: Callable[[str], str] | None = None) -> CostTable:
    """A table from the JSON text of a cost file; ``source`` names it in errors.

    Raises:
        CostTableError: too large, not JSON, not this format or version, or a bad entry (named).
    """
    require_plain(group, "group=", optional=True)
    if len(text) > MAX_BYTES:
        raise CostTableError(f"{source}: larger than {MAX_BYTES} bytes; not a cost table")
    try:
        doc = json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_no_duplicates)
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
    """The cost table in the regular file at ``path`` (:func:`parse_costs`), read no further than
    :data:`MAX_BYTES`.

    Raises:
        TypeError: ``path`` is not a str or path object (an int would be taken as a file descriptor).
        CostTableError: unreadable, not a regular file (a FIFO would block until a writer comes,
            for ever), too large, or refused by :func:`parse_costs`.
    """
    require_plain(group, "group=", optional=True)
    if not isinstance(path, (str, os.PathLike)) or not isinstance(os.fspath(path), str):
        raise TypeError(f"path must be a str or os.PathLike naming a file, got {type(path).__name__}")
    try:
        # O_NONBLOCK: opening a FIFO returns at once instead of waiting for a writer; the file's
        # kind is then seen on what was opened (no gap between a check and the open)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        try:  # a socket cannot be opened at all (ENXIO): say what it is rather than the errno
            kind = _not_regular(os.stat(path).st_mode)
        except OSError:
            kind = ""
        raise CostTableError(f"{path}: not a regular file ({kind}); a cost table is a file" if kind
                             else f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        kind = _not_regular(os.fstat(fd).st_mode)
        if kind:
            raise CostTableError(f"{path}: not a regular file ({kind}); a cost table is a file")
        with open(fd, "rb", closefd=False) as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise CostTableError(f"{path}: cannot read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    return parse_costs(data, source=str(path), group=group)


def _not_regular(mode: int) -> str:
    """What a file that is not a regular one is ("a FIFO" …), or "" for a regular file."""
    for test, name in ((stat.S_ISREG, ""), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a file"
