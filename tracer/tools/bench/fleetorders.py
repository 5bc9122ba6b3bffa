"""``rmqtrace bench fleet --orders``: the send order (arrival vs longest first), issue #34.

The same long-tailed job per run seed, sent in arrival order, longest first by the true
durations, and longest first by costs learned from the same kind's arrival run (±``NOISE``), for
each consumer kind; job time ÷ the fleet's lower bound, median and worst. The longest-first
jobs go to a PRIORITY topic with priorities (``send_job(priority_levels=)``: the broker hands
them out in exactly that order); ``topic="normal"`` sends them to a normal topic instead (the
broker's own rough order), the arrival jobs always go to a normal one.
"""

from __future__ import annotations

import os
import random
import statistics
from typing import Any, Callable, Sequence

from ...dispatch.costtable import CostTable, learn_costs, load_costs
from . import fleet_context, loadavg
from .fleetjob import ENDPOINT, KINDS, FleetRun, long_tail_job
from .fleetmember import run_fleet

__all__ = ["NOISE", "ORDER_KINDS", "ORDER_MODES", "ORDER_TARGETS", "TOPICS", "check_kinds", "format_order_bench",
           "learned_table", "run_order_bench"]

# the demand-driven loop and the push replacement, each without and with receive_ahead (the
# hand-off hidden by the cost send_job wrote on every message), interleaved in one run
ORDER_KINDS = ("demand_driven", "push_replacement", "demand_driven_ahead", "push_replacement_ahead")
# arrival: as the job came; longest_first: send_job by the true durations; learned: send_job by a
# cost table learned from the same kind's arrival run of this job, each time off by up to ±NOISE
ORDER_MODES = ("arrival", "longest_first", "learned")
ORDER_TARGETS = {"longest_first": 1.05, "learned": 1.08}  # worst job time ÷ LB over the runs
NOISE = 0.30
# where the longest-first jobs go: a PRIORITY topic (send_job's priorities), or a normal topic
TOPICS = ("priority", "normal")


def learned_table(run: FleetRun, seed: int, folder: str, noise: float = NOISE) -> CostTable:
    """The cost table ``rmqtrace report --costs`` would learn from ``run`` (each message's measured
    handler seconds by its key, the message index), every cost then scaled by a uniform factor in
    [1 - noise, 1 + noise] (an earlier run is not this one), written to a file and read back."""
    rng = random.Random(seed)
    measured: dict[int, float] = {}
    for r in run.records:
        measured.setdefault(r.message, (r.end_ns - r.start_ns) / 1e9)
    table = learn_costs((str(i), t * rng.uniform(1 - noise, 1 + noise)) for i, t in sorted(measured.items()))
    path = os.path.join(folder, f"costs-{seed}.json")
    table.save(path)
    return load_costs(path)


def check_kinds(kinds: Sequence[str], prefetch: int, topic: str = TOPICS[0]) -> tuple[str, ...]:
    """``kinds`` without repeats, if each is one of :data:`KINDS`, ``prefetch`` >= 1 and
    ``topic`` one of :data:`TOPICS`.

    Raises:
        ValueError: an unknown or no kind, ``prefetch`` < 1, an unknown topic.
    """
    if not kinds or any(k not in KINDS for k in kinds) or prefetch < 1:
        raise ValueError(f"kinds must be some of {', '.join(KINDS)} and prefetch >= 1, "
                         f"got {','.join(kinds)} and {prefetch}")
    if topic not in TOPICS:
        raise ValueError(f"topic must be one of {', '.join(TOPICS)}, got {topic!r}")
    return tuple(dict.fromkeys(kinds))


def run_order_bench(*, messages: int = 500, instances: int = 3, workers: int = 4, runs: int = 5,
                    quick: bool = False, endpoint: str = ENDPOINT, kinds: Sequence[str] = ORDER_KINDS,
                    prefetch: int = 1, topic: str = TOPICS[0],
                    progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """``runs`` runs of the same long-tailed job per run seed, for the demand-driven loop and the
    push replacement, sent in arrival order, longest first by the true durations, and longest
    first by costs learned from that kind's arrival run (±30 % noise). Job time ÷ the fleet's LB,
    median and worst. ``quick``: 150 messages, 3 × 2 workers, one run, shorter long messages.
    ``kinds``: any of :data:`KINDS` (``prefetch`` with a buffer of ``prefetch`` messages).
    ``topic``: where the longest-first jobs go (:data:`TOPICS`). Before the runs (not with
    ``quick``), one uncounted warm-up job per kind and way of sending (``"warmup"`` in the result).

    Raises:
        ValueError: an unknown kind or topic, or ``prefetch`` < 1.
    """
    kinds = check_kinds(kinds, prefetch, topic)
    if quick:
        messages, instances, workers, runs = 150, 3, 2, 1
    import tempfile

    import rocketmq  # noqa: F401 - the members need it: say so before the first progress line
    job_kw: dict[str, Any] = {"long_s": (0.4, 1.5)} if quick else {}
    load_before = loadavg()
    per: dict[str, dict[str, list[dict[str, Any]]]] = {k: {o: [] for o in ORDER_MODES} for k in kinds}
    jobs = []
    # Warm-up, not counted (its figures are in the JSON): one job of each kind per way of sending,
    # the runs' own job. The first longest-first runs after the proxy started were the slow ones
    # (2026-12-05, run A of the PRIORITY topic: 1.059 / 1.053 against 1.020-1.052 after, and an
    # 18 s wait for a first message; the same bench on the warm proxy right after: none of it)
    warmup: list[dict[str, Any]] = []
    if not quick:
        durations = long_tail_job(messages, seed=999, **job_kw)
        for kind in kinds:
            for order, priority in (("arrival", False), ("longest_first", topic == "priority")):
                if progress is not None:
                    progress(f"warm-up: {kind} {order}")
                done = run_fleet(kind, durations, instances=instances, workers=workers, endpoint=endpoint,
                                 order=order, prefetch=prefetch, priority=priority)
                warmup.append({"kind": kind, "order": order, **done.summary()})
    with tempfile.TemporaryDirectory(prefix="rmqtrace-costs-") as folder:
        for r in range(runs):
            durations = long_tail_job(messages, seed=1000 + r, **job_kw)
            jobs.append({"messages": len(durations), "work_s": round(sum(durations), 2),
                         "longest_s": max(durations)})
            turn = r % len(kinds)
            tables: dict[str, CostTable] = {}
            for kind in kinds[turn:] + kinds[:turn]:  # arrival first: the learned costs come from it
                if progress is not None:
                    progress(f"run {r + 1}/{runs}: {kind} arrival")
                done = run_fleet(kind, durations, instances=instances, workers=workers, endpoint=endpoint,
                                 order="arrival", prefetch=prefetch)
                per[kind]["arrival"].append({"run": r + 1, **done.summary()})
                tables[kind] = learned_table(done, seed=2000 + r, folder=folder)
            rest = [(k, o) for o in ORDER_MODES[1:] for k in kinds]
            rest = rest[r % len(rest):] + rest[:r % len(rest)]
            for kind, mode in rest:
                if progress is not None:
                    progress(f"run {r + 1}/{runs}: {kind} {mode}")
                done = run_fleet(kind, durations, instances=instances, workers=workers, endpoint=endpoint,
                                 order="longest_first", costs=tables[kind] if mode == "learned" else None,
                                 prefetch=prefetch, priority=topic == "priority")
                per[kind][mode].append({"run": r + 1, **done.summary()})
    kinds_out: dict[str, Any] = {}
    met = True
    for kind, orders in per.items():
        kinds_out[kind] = {}
        for mode, results in orders.items():
            ratios = [x["makespan_over_lb"] for x in results]
            target = ORDER_TARGETS.get(mode)
            kinds_out[kind][mode] = {
                "median_over_lb": round(statistics.median(ratios), 3), "worst_over_lb": max(ratios),
                "median_over_greedy": round(statistics.median(x["makespan_over_greedy"] for x in results), 3),
                "median_idle_per_message_ms": statistics.median(x["idle_per_message_ms"] for x in results),
                "target_worst_over_lb": target, "target_met": None if target is None else max(ratios) <= target,
                "runs": results,
            }
            if target is not None and max(ratios) > target:
                met = False
    return {
        "bench": "fleet --orders", "instances": instances, "workers": workers, "runs": runs, "jobs": jobs,
        "noise": NOISE, "targets": ORDER_TARGETS, "target_met": met, "topic": topic, "kinds": kinds_out,
        "warmup": warmup,
        **({"prefetch": prefetch} if "prefetch" in kinds else {}),
        **fleet_context(load_before),
    }


def format_order_bench(result: dict[str, Any]) -> str:
    job = result["jobs"][0]
    lines = [
        f"real broker, {job['messages']} long-tailed messages per run ({job['work_s']} s of work, longest "
        f"{job['longest_s']} s in run 1), {result['instances']} processes x {result['workers']} workers, "
        f"{result['runs']} runs; learned costs: from the arrival run, ±{result['noise']:.0%}; longest first "
        f"to a {result['topic'].upper()} topic ({result['client']}, {result['machine']})",
        f"{'consumer':<23} {'sent':<14} {'÷LB per run':<40} {'median':>6} {'worst':>6} {'÷greedy':>7} "
        f"{'idle ms/msg':>11}  target",
    ]
    for kind, orders in result["kinds"].items():
        for mode, m in orders.items():
            per_run = " ".join(f"{x['makespan_over_lb']:.3f}" for x in m["runs"])
            target = "" if m["target_worst_over_lb"] is None else (
                f"worst <= {m['target_worst_over_lb']}: {'met' if m['target_met'] else 'NOT met'}")
            lines.append(f"{kind:<23} {mode:<14} {per_run:<40} {m['median_over_lb']:>6.3f} {m['worst_over_lb']:>6.3f} "
                         f"{m['median_over_greedy']:>7.3f} {m['median_idle_per_message_ms']:>11.1f}  {target}")
    lines.append("÷greedy: over the greedy schedule of the measured handler times in the order sent (LPT for "
                 "longest first: at LB); idle ms/msg: worker-time outside handlers per message, the hand-off")
    lines.append(f"load average before/after: {result['loadavg']['before']} / {result['loadavg']['after']}")
    return "\n".join(lines)
