"""Dispatch policies on a long-tailed job, and the engine against ``ThreadPoolExecutor``.

Part 1 — makespan. For each seed, :func:`tracer.workload.make_job` builds 500 test-case groups
(most a few cases, a few hundreds); a handler sleeps ``cases × scale``. Every policy really runs
the job on 8 worker threads, the submitter feeding messages in job order as fast as the policy
accepts them. Each makespan (first submit → last handler end) is compared with

* LB = ``max(total work / workers, longest message)`` — no schedule can beat it;
* greedy = the exact zero-overhead simulation of "any free worker takes the next message" on the
  durations the handlers really took (so sleep jitter cancels and only dispatcher overhead and
  policy remain); ``*_nominal`` variants use ``cases × scale`` instead;
* the policy's own zero-overhead simulation (``makespan_over_sim``).

Policies: ``aggressive``; ``cost_aware`` with a window covering the job; ``round_robin`` and
``random`` with a per-worker buffer of 10 (the incident). Medians over seeds.

Part 2 — engine overhead against ``concurrent.futures.ThreadPoolExecutor`` (same run, same
handler, 8 threads each, both warmed up):

* throughput: N no-op messages submitted in a tight loop, until all ran and the pool is shut
  down (our ``submit`` blocks for back-pressure; the executor's queue is unbounded, so it is also
  run with a semaphore of N slots — the same back-pressure — for reference);
* hand-off latency: one message at a time to an idle pool (a short pause between messages lets
  every worker block), ``submit`` call → first line of the handler, p50/p99; interleaved blocks.
"""

from __future__ import annotations

import _thread
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ...dispatch import Aggressive, CostAware, Dispatcher, Policy, Random, RoundRobin
from ...dispatch.simulate import (
    lower_bound,
    simulate_cost_aware,
    simulate_greedy,
    simulate_random,
    simulate_round_robin,
)
from ...report.stats import percentile
from ..workload import JobItem, make_job

__all__ = ["format_dispatch_bench", "machine_info", "main", "run_dispatch_bench", "run_executor_bench"]

POLICIES = ("aggressive", "cost_aware", "round_robin", "random")
WORKERS = 8
GROUPS = 500
BUFFER = 10

TARGETS = {
    "aggressive_over_greedy": 1.03,
    "cost_aware_over_lb": 1.02,
    "executor_throughput_ratio": 1.0,  # at least
    "executor_bounded_throughput_ratio": 1.1,  # at least: the executor with the same back-pressure
    "executor_handoff_p50_ratio": 1.0,  # at most
}


def machine_info() -> dict[str, Any]:
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        model = platform.processor()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count() or 0
    return {
        "nproc": usable,
        "cpu_count": os.cpu_count() or 0,
        "cpu_model": model,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "switch_interval_s": sys.getswitchinterval(),
    }


def _policy(name: str, job_len: int, seed: int) -> Policy:
    if name == "aggressive":
        return Aggressive()
    if name == "cost_aware":
        return CostAware(window=max(1, job_len))
    if name == "round_robin":
        return RoundRobin(buffer=BUFFER)
    return Random(buffer=BUFFER, seed=seed)


def _simulate(name: str, durations: list[float], seed: int, window: int) -> float:
    if name == "aggressive":
        return simulate_greedy(durations, WORKERS)
    if name == "cost_aware":
        return simulate_cost_aware(durations, WORKERS, window)
    if name == "round_robin":
        return simulate_round_robin(durations, WORKERS, BUFFER)
    return simulate_random(durations, WORKERS, BUFFER, seed)


def _run_policy(name: str, job: list[JobItem], scale: float, seed: int) -> dict[str, Any]:
    n = len(job)
    starts = [0.0] * n
    ends = [0.0] * n
    accepted = [0.0] * n
    pc = time.perf_counter
    sleep = time.sleep

    def handler(it: tuple[int, JobItem]) -> None:
        i, j = it
        starts[i] = pc()
        sleep(j.cases * scale)
        ends[i] = pc()

    d: Dispatcher[tuple[int, JobItem]] = Dispatcher(
        handler, policy=_policy(name, n, seed), workers=WORKERS, cost=lambda it: it[1].cases, name=f"bench-{name}"
    )
    t0 = pc()
    for i, j in enumerate(job):
        d.submit((i, j))
        accepted[i] = pc()
    d.wait_idle()
    makespan = max(ends) - t0
    d.close()
    measured = [e - s for s, e in zip(starts, ends, strict=True)]
    nominal = [j.cases * scale for j in job]
    waits = [max(0.0, s - a) for s, a in zip(starts, accepted, strict=True)]
    lb = lower_bound(measured, WORKERS)
    greedy = simulate_greedy(measured, WORKERS)
    sim = _simulate(name, measured, seed, n)
    return {
        "seed": seed,
        "makespan_s": makespan,
        "lb_s": lb,
        "greedy_s": greedy,
        "sim_s": sim,
        "lb_nominal_s": lower_bound(nominal, WORKERS),
        "greedy_nominal_s": simulate_greedy(nominal, WORKERS),
        "makespan_over_lb": makespan / lb,
        "makespan_over_greedy": makespan / greedy,
        "makespan_over_sim": makespan / sim,
        "makespan_over_lb_nominal": makespan / lower_bound(nominal, WORKERS),
        "makespan_over_greedy_nominal": makespan / simulate_greedy(nominal, WORKERS),
        "dispatch_wait_p50_s": percentile(waits, 0.50),
        "dispatch_wait_p99_s": percentile(waits, 0.99),
        "dispatch_wait_max_s": max(waits),
        "sleep_overshoot_mean_s": statistics.fmean(m - x for m, x in zip(measured, nominal, strict=True)),
    }


# ------------------------------------------------------------------------------------ executor
def _noop(_: object) -> None:
    return None


def _warm_executor(ex: ThreadPoolExecutor, workers: int) -> None:
    barrier = threading.Barrier(workers + 1)
    for _ in range(workers):
        ex.submit(barrier.wait)
    barrier.wait()


def _throughput_ours(messages: int) -> float:
    d: Dispatcher[None] = Dispatcher(_noop, workers=WORKERS, name="bench-tp")
    submit = d.submit
    t0 = time.perf_counter()
    for _ in range(messages):
        submit(None)
    d.close()
    return messages / (time.perf_counter() - t0)


def _throughput_executor(messages: int) -> float:
    ex = ThreadPoolExecutor(WORKERS)
    _warm_executor(ex, WORKERS)
    submit = ex.submit
    t0 = time.perf_counter()
    for _ in range(messages):
        submit(_noop, None)
    ex.shutdown(wait=True)
    return messages / (time.perf_counter() - t0)


def _throughput_executor_bounded(messages: int) -> float:
    """The executor with the aggressive policy's back-pressure bolted on: a semaphore of N slots."""
    ex = ThreadPoolExecutor(WORKERS)
    _warm_executor(ex, WORKERS)
    slots = threading.BoundedSemaphore(WORKERS)
    acquire = slots.acquire

    def release(_: object) -> None:
        slots.release()

    submit = ex.submit
    t0 = time.perf_counter()
    for _ in range(messages):
        acquire()
        submit(_noop, None).add_done_callback(release)
    ex.shutdown(wait=True)
    return messages / (time.perf_counter() - t0)


def _handoff(submit: Callable[[Callable[[object], None]], object], samples: int, pause: float) -> list[int]:
    """Latency (ns) from ``submit`` to the handler's first line, one message at a time."""
    box = [0]
    sig = _thread.allocate_lock()
    sig.acquire()
    pc = time.perf_counter_ns

    def handler(_: object) -> None:
        box[0] = pc()
        sig.release()

    out: list[int] = []
    sleep = time.sleep
    for _ in range(samples):
        sleep(pause)  # let the worker that just ran block again: the pool is idle
        t0 = pc()
        submit(handler)
        sig.acquire()
        out.append(box[0] - t0)
    return out


def run_executor_bench(messages: int, samples: int, rounds: int) -> dict[str, Any]:
    tp_ours: list[float] = []
    tp_ex: list[float] = []
    tp_bounded: list[float] = []
    for _ in range(rounds):  # interleaved so drift hits all alike
        tp_ours.append(_throughput_ours(messages))
        tp_ex.append(_throughput_executor(messages))
        tp_bounded.append(_throughput_executor_bounded(messages))

    d: Dispatcher[Callable[[object], None]] = Dispatcher(lambda h: h(None), workers=WORKERS, name="bench-handoff")
    ex = ThreadPoolExecutor(WORKERS)
    _warm_executor(ex, WORKERS)
    lat_ours: list[int] = []
    lat_ex: list[int] = []
    block = 250
    pause = 0.0002
    _handoff(d.submit, 50, pause)  # warm-up
    _handoff(lambda h: ex.submit(h, None), 50, pause)
    for _ in range(max(1, samples // block)):
        lat_ours += _handoff(d.submit, block, pause)
        lat_ex += _handoff(lambda h: ex.submit(h, None), block, pause)
    d.close()
    ex.shutdown(wait=True)

    def lat(v: list[int]) -> dict[str, float]:
        return {"p50_us": percentile(v, 0.50) / 1e3, "p90_us": percentile(v, 0.90) / 1e3, "p99_us": percentile(v, 0.99) / 1e3}

    lo, lx = lat(lat_ours), lat(lat_ex)
    tpo, tpx = statistics.median(tp_ours), statistics.median(tp_ex)
    ours: dict[str, Any] = {"throughput_per_s": tpo, "throughput_runs": tp_ours, **lo}
    pool: dict[str, Any] = {"throughput_per_s": tpx, "throughput_runs": tp_ex, **lx}
    tpb = statistics.median(tp_bounded)
    return {
        "threadpool_bounded": {"throughput_per_s": tpb, "throughput_runs": tp_bounded},
        "throughput_ratio_bounded": tpo / tpb,
        "throughput_ratio": tpo / tpx,
        "handoff_p50_ratio": lo["p50_us"] / lx["p50_us"],
        "handoff_p99_ratio": lo["p99_us"] / lx["p99_us"],
        "ours": ours,
        "threadpool": pool,
        "messages": messages,
        "rounds": rounds,
        "samples": len(lat_ours),
        "workers": WORKERS,
    }


# ---------------------------------------------------------------------------------------- main
def run_dispatch_bench(
    seeds: int = 5, quick: bool = False, progress: Callable[[int, int], None] | None = None
) -> dict[str, Any]:
    """Run both parts; see the module docstring. ``quick``: 2 seeds, half the scale, fewer samples."""
    started = time.perf_counter()
    n_seeds = max(1, min(seeds, 2) if quick else seeds)
    scale = 0.001 if quick else 0.002  # seconds per test case
    total = n_seeds * len(POLICIES) + 1
    done = 0
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in POLICIES}
    for seed in range(n_seeds):
        job = make_job(GROUPS, seed=seed)
        for name in POLICIES:
            runs[name].append(_run_policy(name, job, scale, seed))
            done += 1
            if progress is not None:
                progress(done, total)
    executor = run_executor_bench(
        messages=20_000 if quick else 40_000, samples=1_000 if quick else 3_000, rounds=2 if quick else 5
    )
    done += 1
    if progress is not None:
        progress(done, total)

    def med(name: str, field: str) -> float:
        return float(statistics.median(float(r[field]) for r in runs[name]))

    policies: dict[str, dict[str, Any]] = {}
    for name in POLICIES:
        policies[name] = {
            f: med(name, f)
            for f in (
                "makespan_over_lb",
                "makespan_over_greedy",
                "makespan_over_sim",
                "makespan_over_lb_nominal",
                "makespan_over_greedy_nominal",
                "makespan_s",
                "dispatch_wait_p50_s",
                "dispatch_wait_p99_s",
                "dispatch_wait_max_s",
            )
        }
        policies[name]["runs"] = runs[name]
    greedy_over_lb = statistics.median(r["greedy_s"] / r["lb_s"] for r in runs["aggressive"])
    checks = {
        "aggressive_over_greedy": policies["aggressive"]["makespan_over_greedy"] <= TARGETS["aggressive_over_greedy"],
        "cost_aware_over_lb": policies["cost_aware"]["makespan_over_lb"] <= TARGETS["cost_aware_over_lb"],
        "round_robin_worse": policies["round_robin"]["makespan_over_greedy"] > 1.1,
        "executor_throughput_ratio": executor["throughput_ratio"] >= TARGETS["executor_throughput_ratio"],
        "executor_bounded_throughput_ratio": executor["throughput_ratio_bounded"]
        >= TARGETS["executor_bounded_throughput_ratio"],
        "executor_handoff_p50_ratio": executor["handoff_p50_ratio"] <= TARGETS["executor_handoff_p50_ratio"],
    }
    return {
        "bench": "dispatch",
        "command": "rmqtrace bench dispatch" + (" --quick" if quick else f" --seeds {seeds}"),
        "machine": machine_info(),
        "config": {
            "workers": WORKERS,
            "groups": GROUPS,
            "buffer": BUFFER,
            "seeds": n_seeds,
            "quick": quick,
            "scale_s_per_case": scale,
            "cost_aware_window": GROUPS,
        },
        "policies": policies,
        "greedy_over_lb": greedy_over_lb,
        "executor": executor,
        "targets": TARGETS,
        "checks": checks,
        "elapsed_s": time.perf_counter() - started,
    }


def format_dispatch_bench(result: dict[str, Any]) -> str:
    """A markdown summary (tables) of :func:`run_dispatch_bench`'s result."""
    c = result["config"]
    m = result["machine"]
    p = result["policies"]
    e = result["executor"]
    ok = result["checks"]

    def mark(key: str) -> str:
        return "met" if ok.get(key) else "MISSED"

    lines = [
        f"Machine: {m['nproc']} CPUs ({m['cpu_model']}), Python {m['python']} ({m['implementation']}).",
        f"Job: {c['groups']} test-case groups (long tail), {c['workers']} worker threads, handler = sleep(cases × "
        f"{c['scale_s_per_case'] * 1e3:g} ms); medians over {c['seeds']} seed(s). "
        f"Greedy itself is {result['greedy_over_lb']:.3f}× LB on these jobs (a long group may arrive late).",
        "",
        "| policy | makespan | ÷ LB | ÷ greedy | ÷ own simulation | dispatch wait p50 | p99 | max |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    labels = {
        "aggressive": "aggressive",
        "cost_aware": f"cost_aware (window {c['cost_aware_window']})",
        "round_robin": f"round_robin (K={c['buffer']})",
        "random": f"random (K={c['buffer']})",
    }
    for name in POLICIES:
        r = p[name]
        lines.append(
            f"| {labels[name]} | {r['makespan_s']:.2f} s | {r['makespan_over_lb']:.3f} | "
            f"{r['makespan_over_greedy']:.3f} | {r['makespan_over_sim']:.3f} | "
            f"{r['dispatch_wait_p50_s'] * 1e3:.2f} ms | {r['dispatch_wait_p99_s'] * 1e3:.0f} ms | "
            f"{r['dispatch_wait_max_s'] * 1e3:.0f} ms |"
        )
    ours, pool = e["ours"], e["threadpool"]
    lines += [
        "",
        f"Targets: aggressive ≤ {result['targets']['aggressive_over_greedy']}× greedy: "
        f"{mark('aggressive_over_greedy')}; cost_aware ≤ {result['targets']['cost_aware_over_lb']}× LB: "
        f"{mark('cost_aware_over_lb')}; round_robin visibly worse: {mark('round_robin_worse')}.",
        "",
        f"Engine vs ThreadPoolExecutor ({e['workers']} threads each; throughput: {e['messages']:,} no-op "
        f"messages × {e['rounds']} rounds; hand-off: {e['samples']:,} single messages to an idle pool):",
        "",
        "| | no-op throughput | hand-off p50 | p90 | p99 |",
        "|---|---:|---:|---:|---:|",
        f"| rmqtrace Dispatcher (aggressive) | {ours['throughput_per_s']:,.0f}/s | {ours['p50_us']:.1f} µs | "
        f"{ours['p90_us']:.1f} µs | {ours['p99_us']:.1f} µs |",
        f"| ThreadPoolExecutor | {pool['throughput_per_s']:,.0f}/s | {pool['p50_us']:.1f} µs | "
        f"{pool['p90_us']:.1f} µs | {pool['p99_us']:.1f} µs |",
        f"| ratio (ours / executor) | {e['throughput_ratio']:.2f}× | {e['handoff_p50_ratio']:.2f}× | | "
        f"{e['handoff_p99_ratio']:.2f}× |",
        f"| ThreadPoolExecutor + semaphore of {e['workers']} (same back-pressure) | "
        f"{e['threadpool_bounded']['throughput_per_s']:,.0f}/s (ours {e['throughput_ratio_bounded']:.2f}×) | | | |",
        "",
        f"Targets: throughput ≥ {result['targets']['executor_throughput_ratio']}×: "
        f"{mark('executor_throughput_ratio')}; ≥ {result['targets']['executor_bounded_throughput_ratio']}× the "
        f"executor with the same back-pressure: {mark('executor_bounded_throughput_ratio')}; hand-off p50 ≤ 1.0×: "
        f"{mark('executor_handoff_p50_ratio')}. Bench time {result['elapsed_s']:.0f} s.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m tracer.bench.dispatch [--quick] [--seeds N] [--json]``."""
    import argparse
    import json

    ap = argparse.ArgumentParser(prog="python -m tracer.bench.dispatch")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    result = run_dispatch_bench(
        seeds=args.seeds, quick=args.quick, progress=lambda d, t: print(f"  {d}/{t}", file=sys.stderr)
    )
    print(json.dumps(result, indent=2) if args.json else format_dispatch_bench(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
