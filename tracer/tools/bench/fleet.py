"""One long-tailed job over a consumer group of C separate processes × W workers, on the real broker.

Needs the local RocketMQ 5 (``services/rocketmq/rmq.sh start``, proxy gRPC ``127.0.0.1:8081``) and
``rocketmq-python-client``. Per run and mode, a fresh topic (4 queues, the default for a new
topic here; a push consumer is assigned whole queues) gets the whole job first (it waits in the
broker), then C member processes of one fresh consumer group are started, wait until every one is
ready, and are told to go at the same instant. Four modes, interleaved in a
rotating order per run:

- ``push_consumer``: the official ``PushConsumer`` with its defaults (cache of up to 1024 messages
  per queue, receive batches of 32) and ``consumption_thread_count=W``, its listener wrapped in
  :class:`~tracer.clients.official.TracedListener`;
- ``prefetch``: :class:`~tracer.clients.consume.ConsumeLoop` with a prefetch buffer of
  ``PREFETCH`` messages (received ahead, like a client cache);
- ``demand_driven``: ``ConsumeLoop`` receiving only what its W workers can start;
- ``push_replacement``: :class:`~tracer.clients.demandpush.DemandPushConsumer` — the push
  consumer's own constructor and listener with ``consumption_thread_count=W``, the one-line fix
  (demand-driven underneath).

Every member traces its messages with a :class:`MessageTracer` fed into an
:class:`~tracer.telemetry.occupancy.Occupancy` (W workers); ``--metrics-ports`` serves each
member's ``rmqtrace_consumer_*`` series on its own loopback port (the end-to-end alert test
scrapes them). A member reports every handled message (receive, handler start, handler end, on
one host's clock) and its occupancy totals at exit.

Per mode and run: job time (go → last handler end) ÷ the fleet lower bound max(work / (C·W),
longest) and ÷ the exact greedy list schedule of the measured durations on C·W workers in send
order; messages and busy share per instance; the most messages any instance held unstarted; the
fleet's idle worker-seconds while another instance held unstarted work (∫ min(idle workers of
instances holding nothing, messages held elsewhere) dt, from the members' stamps); the exact
in-process head-of-line worker-seconds (the members' counters); time to the first handler.

What is exact and what is not. ConsumeLoop members see every receipt and every handler start and
end, so their occupancy is exact. A push consumer's cache is invisible to its listener, which
sees a message only when a pool thread starts it; the members announce each received batch with
:func:`~tracer.clients.pushcache.watch_push_cache` (the client's public
``client_metrics.receive_after``, called for every batch before caching it), so the unstarted
count is exact there too. Without that seam (a plain
``TracedListener``), busy and idle workers stay exact but unstarted messages are seen only as they
start: the in-process counter then under-counts and the fleet gauges miss the cache.

``--orders`` (:mod:`.fleetorders`) is the send-order bench: arrival vs longest first, for the
demand-driven loop and the push replacement, each also with ``receive_ahead`` (the kinds
``demand_driven_ahead`` and ``push_replacement_ahead``). The job and its bounds are in
:mod:`.fleetjob`, the member processes and one run in :mod:`.fleetmember`.
"""


from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any, Callable, Sequence

from . import fleet_context, loadavg
from .fleetjob import ENDPOINT, KINDS, MODES, PREFETCH, FleetRun, Handled, fleet_greedy, fleet_waits, long_tail_job
from .fleetmember import member_main, run_fleet
from .fleetorders import (
    NOISE,
    ORDER_KINDS,
    ORDER_MODES,
    ORDER_TARGETS,
    TOPICS,
    check_kinds,
    format_order_bench,
    learned_table,
    run_order_bench,
)

__all__ = [
    "KINDS",
    "MODES",
    "NOISE",
    "FleetRun",
    "Handled",
    "fleet_greedy",
    "fleet_waits",
    "ORDER_KINDS",
    "ORDER_MODES",
    "ORDER_TARGETS",
    "format_fleet_bench",
    "check_kinds",
    "format_order_bench",
    "learned_table",
    "long_tail_job",
    "main",
    "run_cli",
    "run_fleet",
    "run_fleet_bench",
    "run_order_bench",
]

TARGET = 1.05  # demand-driven and push-replacement job time ÷ fleet greedy, in every run
TARGET_MODES = ("demand_driven", "push_replacement")


# -- the bench -----------------------------------------------------------------------------------------
def run_fleet_bench(*, messages: int = 500, instances: int = 3, workers: int = 4, runs: int = 3,
                    quick: bool = False, endpoint: str = ENDPOINT,
                    progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """``runs`` runs of every mode, interleaved (the order rotates per run). ``quick``: 150 messages,
    3 × 2 workers, one run, shorter long messages — for the end-to-end test."""
    if quick:
        messages, instances, workers, runs = 150, 3, 2, 1
    # the fleet's processes need the 5.x client: say so before the first progress line, not after
    import rocketmq  # noqa: F401
    job_kw: dict[str, Any] = {"long_s": (0.4, 1.5)} if quick else {}
    load_before = loadavg()
    per_mode: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    jobs = []
    for r in range(runs):
        durations = long_tail_job(messages, seed=1000 + r, **job_kw)
        jobs.append({"messages": len(durations), "work_s": round(sum(durations), 2), "longest_s": max(durations)})
        order = MODES[r % len(MODES):] + MODES[:r % len(MODES)]
        for mode in order:
            if progress is not None:
                progress(f"run {r + 1}/{runs}: {mode}")
            result = run_fleet(mode, durations, instances=instances, workers=workers, endpoint=endpoint)
            per_mode[mode].append({"run": r + 1, **result.summary()})
    modes: dict[str, Any] = {}
    for mode, results in per_mode.items():
        modes[mode] = {
            "makespan_over_lb": round(statistics.median(x["makespan_over_lb"] for x in results), 3),
            "makespan_over_greedy": round(statistics.median(x["makespan_over_greedy"] for x in results), 3),
            "worst_over_greedy": max(x["makespan_over_greedy"] for x in results),
            "idle_worker_seconds": round(statistics.median(x["idle_worker_seconds"] for x in results), 2),
            "runs": results,
        }
    targeted = [x["makespan_over_greedy"] for m in TARGET_MODES for x in per_mode[m]]
    return {
        "instances": instances, "workers": workers, "runs": runs, "jobs": jobs, "prefetch": PREFETCH,
        "target": TARGET, "target_modes": list(TARGET_MODES),
        "target_met": all(x <= TARGET for x in targeted), "modes": modes,
        **fleet_context(load_before),
    }


def format_fleet_bench(result: dict[str, Any]) -> str:
    job = result["jobs"][0]
    lines = [
        f"real broker, {job['messages']} long-tailed messages per run ({job['work_s']} s of work, longest "
        f"{job['longest_s']} s in run 1), {result['instances']} processes x {result['workers']} workers, "
        f"{result['runs']} runs, modes interleaved ({result['client']}, {result['machine']})",
        f"{'mode':<16} {'run':>3} {'job s':>6} {'÷LB':>5} {'÷greedy':>7} {'messages per process':<22} "
        f"{'max held':>8} {'idle w-s, held elsewhere':>24} {'HOL in proc w-s':>15} {'first':>6}",
    ]
    for mode in MODES:
        for x in result["modes"][mode]["runs"]:
            lines.append(
                f"{mode:<16} {x['run']:>3} {x['makespan_s']:>6.2f} {x['makespan_over_lb']:>5.2f} "
                f"{x['makespan_over_greedy']:>7.2f} {' / '.join(map(str, x['messages_per_instance'])):<22} "
                f"{x['max_held_unstarted']:>8} {x['idle_worker_seconds']:>24.1f} {x['inprocess_hol_seconds']:>15.1f} "
                f"{x['first_handler_s']:>6.2f}")
    for mode in MODES:
        m = result["modes"][mode]
        met = "met" if m["worst_over_greedy"] <= result["target"] else "NOT met"
        aim = f" (target <= {result['target']} in every run: {met})" if mode in TARGET_MODES else ""
        lines.append(f"{mode} ÷ greedy: median {m['makespan_over_greedy']:.3f}, worst {m['worst_over_greedy']:.3f}{aim}")
    lines.append(f"load average before/after: {result['loadavg']['before']} / {result['loadavg']['after']}")
    return "\n".join(lines)


def run_cli(args: argparse.Namespace, console: Any = None) -> int:
    """``rmqtrace bench fleet``: ``--quick``, ``--json``, ``--orders`` and ``--runs`` from the bench parser."""
    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    runs = getattr(args, "runs", None)
    if getattr(args, "orders", False):
        result = run_order_bench(quick=bool(getattr(args, "quick", False)), runs=runs or 5, progress=say,
                                 topic=getattr(args, "topic", TOPICS[0]))
        print(json.dumps(result) if getattr(args, "json", False) else format_order_bench(result))
        return 0
    result = run_fleet_bench(quick=bool(getattr(args, "quick", False)), runs=runs or 3, progress=say)
    print(json.dumps(result) if getattr(args, "json", False) else format_fleet_bench(result))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tracer.tools.bench.fleet", description=__doc__.split("\n\n")[0])
    p.add_argument("--member", help=argparse.SUPPRESS)  # internal: run one member process
    p.add_argument("--messages", type=int, default=500)
    p.add_argument("--instances", type=int, default=3)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--runs", type=int, default=None, help="runs per mode (default 3; 5 with --orders)")
    p.add_argument("--orders", action="store_true",
                   help="arrival order vs longest first (true and learned costs), demand-driven and push replacement")
    p.add_argument("--kinds", default=",".join(ORDER_KINDS),
                   help=f"--orders: comma-separated consumers, any of {','.join(KINDS)} (default %(default)s)")
    p.add_argument("--prefetch", type=int, default=1, help="--orders, kind prefetch: its buffer (default 1)")
    p.add_argument("--topic", choices=TOPICS, default=TOPICS[0],
                   help="--orders: where the longest-first jobs go (default %(default)s)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.member:
        try:
            return member_main(json.loads(args.member), sys.stdout, sys.stdin)
        except Exception as exc:  # noqa: BLE001 - told to the coordinator, which fails loudly
            print(json.dumps({"error": repr(exc)}), flush=True)
            return 1
    if args.runs is not None and args.runs < 1:
        p.error(f"--runs must be at least 1, got {args.runs}")
    kw = {"messages": args.messages, "instances": args.instances, "workers": args.workers, "quick": args.quick,
          "progress": lambda s: print(s, file=sys.stderr, flush=True)}
    if args.orders:
        try:
            kinds = check_kinds(args.kinds.split(","), args.prefetch, args.topic)
        except ValueError as exc:
            p.error(str(exc))
        result = run_order_bench(runs=args.runs or 5, kinds=kinds, prefetch=args.prefetch, topic=args.topic, **kw)
        print(json.dumps(result) if args.json else format_order_bench(result))
        return 0
    result = run_fleet_bench(runs=args.runs or 3, **kw)
    print(json.dumps(result) if args.json else format_fleet_bench(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
