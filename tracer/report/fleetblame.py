"""Blame across a fleet: a wait is avoidable in the fleet when a worker of another instance was
available meanwhile (waiting in one process while another idled); :func:`fleet_blame` credits the
runs that held such waits up, with :func:`~tracer.report.blame.blame`'s rules inside each
instance on the fleet's busy time. Definitions in :mod:`tracer.report.blame`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from .blame import GRACE_NS, Run, all_busy, blame
from .intervals import IntervalSet, intersection

__all__ = ["FleetBlocker", "fleet_avoidable", "fleet_blame"]


def fleet_avoidable(instances: Sequence[Sequence[Run]], workers: Sequence[int], *,
                    grace_ns: int = GRACE_NS, occupied: Sequence[Sequence[Run]] | None = None) -> dict[str, float]:
    """Across instances: consumer_wait, the part avoidable inside the message's own instance, and the
    part during which another instance had an available worker (``elsewhere``), in seconds; shares of
    consumer_wait for both, and for either (``fleet``).

    ``occupied``: per instance, every run that held one of its workers (other jobs' messages
    too), when ``instances`` are only some of them (one job's): a worker busy with another job's
    message is not available. Default: the runs of ``instances`` themselves.

    Raises:
        ValueError: ``instances``, ``workers`` (and ``occupied``) differ in length.
    """
    if len(instances) != len(workers) or (occupied is not None and len(occupied) != len(instances)):
        raise ValueError(f"{len(instances)} instances but {len(workers)} worker counts"
                         + ("" if occupied is None else f" and {len(occupied)} occupied run lists"))
    busy = _busy_of(instances if occupied is None else occupied, workers, grace_ns)
    everyone = intersection(busy)
    wait = inside = elsewhere = either = 0
    for i, rs in enumerate(instances):
        others = intersection([busy[j] for j in range(len(busy)) if j != i]) if len(busy) > 1 else None
        for r in rs:
            wait += max(0, r.start_ns - r.wait_start_ns)
            a, b = r.wait_start_ns + grace_ns, r.start_ns
            if b <= a:
                continue
            inside += (b - a) - busy[i].covered(a, b)
            if others is not None:
                elsewhere += (b - a) - others.covered(a, b)
                either += (b - a) - everyone.covered(a, b)
            else:
                either += (b - a) - busy[i].covered(a, b)

    def share(x: int) -> float:
        return x / wait if wait else 0.0

    return {"consumer_wait_s": wait / 1e9, "avoidable_inside_s": inside / 1e9, "avoidable_elsewhere_s": elsewhere / 1e9,
            "avoidable_fleet_s": either / 1e9, "inside_share": share(inside), "elsewhere_share": share(elsewhere),
            "fleet_share": share(either)}


@dataclass(frozen=True, slots=True)
class FleetBlocker:
    """A run that held up waits which some instance of the fleet could have served."""

    instance: str
    message_id: str
    label: str
    worker: int
    handler_s: float
    victims: int
    held_up_s: float  # the fleet-avoidable wait it caused: victims × seconds

    def as_dict(self) -> dict[str, Any]:
        return {"instance": self.instance, "message_id": self.message_id, "label": self.label, "worker": self.worker,
                "handler_s": round(self.handler_s, 6), "victims": self.victims, "held_up_s": round(self.held_up_s, 6)}


def fleet_blame(instances: Sequence[Sequence[Run]], workers: Sequence[int], names: Sequence[str], *,
                blockers_known: Sequence[bool] | None = None, grace_ns: int = GRACE_NS, top: int = 10,
                max_overlaps: int | None = None, occupied: Sequence[Sequence[Run]] | None = None,
                ) -> tuple[dict[str, float], tuple[FleetBlocker, ...]]:
    """:func:`fleet_avoidable`, and the runs that held up the fleet-avoidable waits, ranked.

    Every instance is blamed with :func:`blame` on the fleet's ``busy`` (no worker of any instance
    available): within an instance the blocker rules are the usual ones (its worker's run, or the
    run holding up the instance's backlog), and a run is credited with the part of each wait it
    held up during which some worker of the fleet was available. So the credits of an instance add
    up to at most its share of ``avoidable_fleet_s``. Ranked by ``held_up_s``, then instance name,
    then message id; an instance whose worker ids are not known (``blockers_known``) names none.

    ``max_overlaps`` bounds the steps of all instances together (:func:`blame`). ``occupied``: as
    for :func:`fleet_avoidable` (only ``instances`` are victims and blockers).

    Raises:
        ValueError: ``instances``, ``workers`` and ``names`` differ in length.
        TooManyOverlaps: the blockers would take more than ``max_overlaps`` steps.
    """
    if not len(instances) == len(workers) == len(names):
        raise ValueError(f"{len(instances)} instances, {len(workers)} worker counts, {len(names)} names")
    known = list(blockers_known) if blockers_known is not None else [True] * len(instances)
    shares = fleet_avoidable(instances, workers, grace_ns=grace_ns, occupied=occupied)
    everyone = intersection(_busy_of(instances if occupied is None else occupied, workers, grace_ns))
    ranked: list[FleetBlocker] = []
    for rs, w, name, k in zip(instances, workers, names, known):
        if not rs or not k:
            continue
        b = blame(rs, max(1, w), grace_ns=grace_ns, busy=everyone, top=len(rs), max_overlaps=max_overlaps)
        if max_overlaps is not None:
            max_overlaps -= b.overlaps
        ranked += [FleetBlocker(name, x.message_id, x.label, x.worker, x.handler_s, x.victims, x.held_up_s)
                   for x in b.top]
    ranked.sort(key=lambda x: (-x.held_up_s, x.instance, x.message_id))
    return shares, tuple(ranked[:max(0, top)])


def _busy_of(occupied: Sequence[Sequence[Run]], workers: Sequence[int], grace_ns: int) -> list[IntervalSet]:
    return [all_busy(rs, max(1, w), grace_ns) for rs, w in zip(occupied, workers)]
