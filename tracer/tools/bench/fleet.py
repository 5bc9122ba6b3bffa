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
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import IO, Any, Callable, Sequence

from ...dispatch.costtable import CostTable, learn_costs, load_costs
from ...path.names import JOB_ORDERS
from ...report.fleet import Handled, sweep_waits
from . import client_version, loadavg, rmq_admin

__all__ = [
    "MODES",
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

ENDPOINT = "127.0.0.1:8081"
MODES = ("push_consumer", "prefetch", "demand_driven", "push_replacement")
PREFETCH = 32
QUEUES = 4
TARGET = 1.05  # demand-driven and push-replacement job time ÷ fleet greedy, in every run
TARGET_MODES = ("demand_driven", "push_replacement")


# -- the job and its bounds ------------------------------------------------------------------------
def long_tail_job(n: int, seed: int, *, long_share: float = 0.04, short_s: float = 0.03,
                  long_s: tuple[float, float] = (0.8, 4.0)) -> list[float]:
    """Handler seconds of ``n`` messages: most short (lognormal around ``short_s``), a few long.

    Raises:
        ValueError: ``n`` < 1.
    """
    if n < 1:
        raise ValueError(f"a job needs at least one message, got n={n}")
    rng = random.Random(seed)
    n_long = max(1, round(n * long_share))
    out = [min(0.25, short_s * rng.lognormvariate(0, 0.6)) for _ in range(n - n_long)]
    out += [rng.uniform(*long_s) for _ in range(n_long)]
    rng.shuffle(out)
    return [round(d, 4) for d in out]


def fleet_greedy(durations: Sequence[float], workers: int) -> float:
    """Makespan of greedy list scheduling in the given order: each message to the first free worker."""
    free = [0.0] * workers
    for d in durations:
        heapq.heapreplace(free, free[0] + d)
    return max(free)


def fleet_waits(records: Sequence[Handled], instances: int, workers: int, t0_ns: int) -> dict[str, Any]:
    """Sweep the members' stamps (:func:`tracer.report.fleet.sweep_waits` with W workers each)."""
    return sweep_waits(records, [workers] * instances, t0_ns)


# -- one run of one mode -----------------------------------------------------------------------------
@dataclass
class FleetRun:
    mode: str
    instances: int
    workers: int
    durations: list[float]
    t0_ns: int = 0
    records: list[Handled] = field(default_factory=list)
    occupancy: list[dict[str, float]] = field(default_factory=list)  # per member, at its exit
    group: str = ""
    sent: list[int] | None = None  # message indexes in the order sent; None: job order

    def send_order(self) -> list[int]:
        return self.sent if self.sent is not None else list(range(len(self.durations)))

    def summary(self) -> dict[str, Any]:
        first: dict[int, Handled] = {}
        for r in self.records:
            if r.message not in first or r.end_ns < first[r.message].end_ns:
                first[r.message] = r
        handled = list(first.values())
        makespan = (max(r.end_ns for r in handled) - self.t0_ns) / 1e9
        measured = [0.0] * len(self.durations)
        for r in handled:
            measured[r.message] = (r.end_ns - r.start_ns) / 1e9
        n_workers = self.instances * self.workers
        lb = max(sum(measured) / n_workers, max(measured))
        greedy = fleet_greedy([measured[i] for i in self.send_order()], n_workers)  # in the order sent
        busy = [0.0] * self.instances
        count = [0] * self.instances
        for r in self.records:
            busy[r.instance] += (r.end_ns - r.start_ns) / 1e9
            count[r.instance] += 1
        waits = fleet_waits(self.records, self.instances, self.workers, self.t0_ns)
        return {
            "mode": self.mode,
            "makespan_s": round(makespan, 3),
            "lower_bound_s": round(lb, 3),
            "greedy_s": round(greedy, 3),
            # the fleet's worker-time not in a handler until the job ended, per message: the hand-off
            # (receive, ack, start) plus the end's stragglers; what keeps a longest-first job off LB
            "idle_per_message_ms": round((n_workers * makespan - sum(measured)) / len(handled) * 1000, 1),
            "makespan_over_lb": round(makespan / lb, 3),
            "makespan_over_greedy": round(makespan / greedy, 3),
            "messages_per_instance": count,
            "busy_share_per_instance": [round(b / sum(busy), 3) if sum(busy) else 0.0 for b in busy],
            "max_held_unstarted": max(waits["max_held"]),
            "max_held_per_instance": waits["max_held"],
            "idle_worker_seconds": round(waits["fleet_idle_while_held_s"], 2),
            "inprocess_hol_seconds": round(sum(o.get("hol_s", 0.0) for o in self.occupancy), 2),
            "first_handler_s": round((min(r.start_ns for r in handled) - self.t0_ns) / 1e9, 3),
            "redelivered": len(self.records) - len(handled),
        }



def _produce(topic: str, durations: Sequence[float], endpoint: str, order: str | None = None,
             costs: Sequence[float] | CostTable | None = None) -> list[int] | None:
    """The job into ``topic``: with ``order`` through ``TracedProducer.send_job`` (one by one, in
    that order, by ``costs``: a cost per message or a table keyed by the message's index), else
    all at once with ``send_async`` in job order. Returns the message indexes in send order (None: job order)."""
    from ...clients.producer import TracedProducer, ordered_job
    from ...clients.quiet import import_quietly
    from ...dispatch.cost import message_key
    from ...telemetry.tracer import MessageTracer

    rmq = import_quietly()
    producer = rmq.Producer(rmq.ClientConfiguration(endpoint, rmq.Credentials()), (topic,))
    producer.startup()
    try:
        messages = []
        for i, d in enumerate(durations):
            m = rmq.Message()
            m.topic = topic
            m.body = f"{i}:{d}".encode()
            m.keys = str(i)
            messages.append(m)
        if order is not None:
            per_message = list(durations) if costs is None else costs
            cost: Callable[[Any], float] | CostTable = (
                per_message if isinstance(per_message, CostTable)
                else lambda m: per_message[int(message_key(m) or 0)])
            sent = [int(message_key(m) or 0) for m, _ in ordered_job(messages, cost, order)]
            TracedProducer(producer, MessageTracer()).send_job(messages, cost=cost, order=order)
            return sent
        futures = [producer.send_async(m) for m in messages]
        for f in futures:
            f.result(timeout=60)
        return None
    finally:
        producer.shutdown()


class _Member:
    def __init__(self, index: int, config: dict[str, Any]) -> None:
        self.index = index
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tracer.tools.bench.fleet", "--member", json.dumps(config)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        self.ready = threading.Event()
        self.records: list[Handled] = []
        self.occupancy: dict[str, float] = {}
        self.error = ""
        self._reader = threading.Thread(target=self._read, name=f"fleet-member-{index}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "ready" in msg:
                self.ready.set()
            elif "h" in msg:
                i, pull, start, end = msg["h"]
                self.records.append(Handled(i, self.index, pull, start, end))
            elif "occupancy" in msg:
                self.occupancy = msg["occupancy"]
            elif "error" in msg:
                self.error = msg["error"]
                self.ready.set()

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def finish(self, timeout: float) -> None:
        self.send("stop")
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._reader.join(10)


def run_fleet(mode: str, durations: Sequence[float], *, instances: int, workers: int,
              endpoint: str = ENDPOINT, metrics_ports: Sequence[int] | None = None,
              timeout: float = 120.0, linger: float = 0.0, order: str | None = None,
              costs: Sequence[float] | CostTable | None = None, prefetch: int = PREFETCH) -> FleetRun:
    """Run one job once in ``mode``; see the module docstring. ``linger``: seconds the members stay
    up after the job (so a scraper sees their last values). ``order``: send the job with
    ``send_job`` in this order (by ``costs``, default the true durations); None: all at once.
    ``prefetch``: the ``prefetch`` mode's buffer.

    Raises:
        ValueError: an unknown mode or order, fewer than one instance or worker, ports not one per instance.
        RuntimeError: a member failed, or the job did not finish within ``timeout`` seconds.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if instances < 1 or workers < 1:
        raise ValueError(f"instances and workers must be at least 1, got {instances} and {workers}")
    if metrics_ports is not None and len(metrics_ports) != instances:
        raise ValueError(f"metrics_ports must name one port per instance ({instances}), got {len(metrics_ports)}")
    if order is not None and order not in JOB_ORDERS:
        raise ValueError(f"order must be one of {JOB_ORDERS}, got {order!r}")
    admin = rmq_admin("fleet")
    run_id = uuid.uuid4().hex[:8]
    topic = f"rmqtrace-fleet-{run_id}"
    group = f"rmqtrace-fleet-{mode.replace('_', '-')}-{run_id}"
    admin.create_topic(topic, queues=QUEUES)
    admin.create_group(group)
    sent = _produce(topic, durations, endpoint, order, costs)
    run = FleetRun(mode, instances, workers, list(durations), group=group, sent=sent)
    members = [
        _Member(i, {"mode": mode, "endpoint": endpoint, "topic": topic, "group": group, "workers": workers,
                    "port": metrics_ports[i] if metrics_ports else None, "prefetch": prefetch})
        for i in range(instances)]
    try:
        deadline = time.monotonic() + 60
        for m in members:
            if not m.ready.wait(max(0.0, deadline - time.monotonic())) or m.error:
                raise RuntimeError(f"fleet member {m.index} ({mode}) not ready: {m.error or 'timeout'}")
        run.t0_ns = time.time_ns()
        for m in members:
            m.send("go")
        n = len(durations)
        deadline = time.monotonic() + timeout
        while len({r.message for m in members for r in m.records}) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"fleet job ({mode}) unfinished after {timeout:g} s")
            if any(m.proc.poll() is not None for m in members):
                raise RuntimeError(f"a fleet member ({mode}) exited early: "
                                   + "; ".join(m.error for m in members if m.error))
            time.sleep(0.05)  # real-time: polling the members' reports while they work
        if linger > 0:
            time.sleep(linger)  # real-time: the members' last values stay scrapeable
    finally:
        for m in members:
            m.finish(timeout=30)
    for m in members:
        run.records.extend(m.records)
        run.occupancy.append(m.occupancy)
    return run


# -- the member process ------------------------------------------------------------------------------
def _member(config: dict[str, Any], out: IO[str], inp: IO[str]) -> int:
    from prometheus_client import CollectorRegistry, start_http_server

    from ...clients.consume import ConsumeLoop
    from ...clients.official import TracedListener
    from ...clients.pushcache import watch_push_cache
    from ...clients.quiet import import_quietly
    from ...path.stages import Outcome, Stage
    from ...telemetry.occupancy import OccupancyMetrics
    from ...telemetry.tracer import MessageTrace, MessageTracer

    lock = threading.Lock()

    def emit(obj: dict[str, Any]) -> None:
        with lock:
            out.write(json.dumps(obj) + "\n")
            out.flush()

    mode, workers, group, topic = config["mode"], int(config["workers"]), config["group"], config["topic"]
    rmq = import_quietly()
    registry = CollectorRegistry()
    occupancy = OccupancyMetrics(registry=registry).track(group, workers)
    if config.get("port"):
        start_http_server(int(config["port"]), addr="127.0.0.1", registry=registry)

    def on_finish(trace: MessageTrace, _outcome: Outcome) -> None:
        t = trace.stamps.times
        keys = trace.info.keys
        if keys and t[Stage.HANDLER_START] and t[Stage.HANDLER_END]:
            emit({"h": [int(keys[0]), t[Stage.CLIENT_PULL], t[Stage.HANDLER_START], t[Stage.HANDLER_END]]})

    tracer = MessageTracer(consumer_group=group, occupancy=occupancy, listeners=[on_finish])

    def work(body: bytes) -> None:
        time.sleep(float(body.decode().split(":")[1]))  # real-time: the handler's work is the benchmark

    cfg = rmq.ClientConfiguration(config["endpoint"], rmq.Credentials())
    start: Callable[[], None]
    close: Callable[[], None]
    if mode == "push_consumer":
        class Listener(rmq.MessageListener):  # type: ignore[misc,name-defined]
            def consume(self, message: Any) -> Any:
                work(message.body)
                return rmq.ConsumeResult.SUCCESS

        consumer = rmq.PushConsumer(cfg, group, TracedListener(Listener(), tracer),
                                    {topic: rmq.FilterExpression()}, consumption_thread_count=workers)
        watch_push_cache(consumer, occupancy)  # the cache is invisible to the listener
        start, close = consumer.startup, consumer.shutdown
    elif mode == "push_replacement":
        from ...clients.demandpush import DemandPushConsumer

        class Plain(rmq.MessageListener):  # type: ignore[misc,name-defined]
            def consume(self, message: Any) -> Any:
                work(message.body)
                return rmq.ConsumeResult.SUCCESS

        # the push consumer's line with one word changed; it traces itself (no TracedListener)
        replacement = DemandPushConsumer(cfg, group, Plain(), {topic: rmq.FilterExpression()},
                                         consumption_thread_count=workers, tracer=tracer)
        start, close = replacement.startup, replacement.shutdown
    else:
        consumer = rmq.SimpleConsumer(cfg, group, {topic: rmq.FilterExpression()}, await_duration=1)
        consumer.startup()
        settled = getattr(consumer, "_init_settings_event", None)  # 5.1.2: startup() does not wait for it
        if settled is not None:
            settled.wait(15)
        loop = ConsumeLoop(consumer, lambda msg: work(msg.body), tracer=tracer, policy="aggressive",
                           workers=workers, prefetch=int(config.get("prefetch", PREFETCH)) if mode == "prefetch" else 0,
                           invisible_duration=60)
        runner = threading.Thread(target=loop.run, name="fleet-loop", daemon=True)

        def close_loop() -> None:
            loop.stop()
            runner.join(30)
            consumer.shutdown()

        start, close = runner.start, close_loop
    emit({"ready": True})
    for line in inp:
        cmd = line.strip()
        if cmd == "go":
            start()
        elif cmd == "stop":
            break
    try:
        close()
    except Exception as exc:  # noqa: BLE001 - the report below matters more than a clean shutdown
        emit({"error": f"shutdown: {exc!r}"})
    occupancy.close()
    s = occupancy.statistics()
    emit({"occupancy": {"busy_s": s.busy_s, "idle_s": s.idle_s, "hol_s": s.hol_s, "holding_s": s.holding_s}})
    return 0


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
        "loadavg": {"before": load_before, "after": loadavg()},
        "client": client_version(), "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
    }

# -- the send order: arrival vs longest first (issue #34) ----------------------------------------
ORDER_KINDS = ("demand_driven", "push_replacement")
# arrival: as the job came; longest_first: send_job by the true durations; learned: send_job by a
# cost table learned from the same kind's arrival run of this job, each time off by up to ±NOISE
ORDER_MODES = ("arrival", "longest_first", "learned")
ORDER_TARGETS = {"longest_first": 1.05, "learned": 1.08}  # worst job time ÷ LB over the runs
NOISE = 0.30


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


def check_kinds(kinds: Sequence[str], prefetch: int) -> tuple[str, ...]:
    """``kinds`` without repeats, if each is one of :data:`MODES` and ``prefetch`` >= 1.

    Raises:
        ValueError: an unknown or no kind, or ``prefetch`` < 1.
    """
    if not kinds or any(k not in MODES for k in kinds) or prefetch < 1:
        raise ValueError(f"kinds must be some of {', '.join(MODES)} and prefetch >= 1, "
                         f"got {','.join(kinds)} and {prefetch}")
    return tuple(dict.fromkeys(kinds))


def run_order_bench(*, messages: int = 500, instances: int = 3, workers: int = 4, runs: int = 5,
                    quick: bool = False, endpoint: str = ENDPOINT, kinds: Sequence[str] = ORDER_KINDS,
                    prefetch: int = 1, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """``runs`` runs of the same long-tailed job per run seed, for the demand-driven loop and the
    push replacement, sent in arrival order, longest first by the true durations, and longest
    first by costs learned from that kind's arrival run (±30 % noise). Job time ÷ the fleet's LB,
    median and worst. ``quick``: 150 messages, 3 × 2 workers, one run, shorter long messages.
    ``kinds``: any of :data:`MODES` (``prefetch`` with a buffer of ``prefetch`` messages).

    Raises:
        ValueError: an unknown kind, or ``prefetch`` < 1.
    """
    kinds = check_kinds(kinds, prefetch)
    if quick:
        messages, instances, workers, runs = 150, 3, 2, 1
    import tempfile

    import rocketmq  # noqa: F401 - the members need it: say so before the first progress line
    job_kw: dict[str, Any] = {"long_s": (0.4, 1.5)} if quick else {}
    load_before = loadavg()
    per: dict[str, dict[str, list[dict[str, Any]]]] = {k: {o: [] for o in ORDER_MODES} for k in kinds}
    jobs = []
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
                                 prefetch=prefetch)
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
        "noise": NOISE, "targets": ORDER_TARGETS, "target_met": met, "kinds": kinds_out,
        **({"prefetch": prefetch} if "prefetch" in kinds else {}),
        "loadavg": {"before": load_before, "after": loadavg()},
        "client": client_version(), "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
    }


def format_order_bench(result: dict[str, Any]) -> str:
    job = result["jobs"][0]
    lines = [
        f"real broker, {job['messages']} long-tailed messages per run ({job['work_s']} s of work, longest "
        f"{job['longest_s']} s in run 1), {result['instances']} processes x {result['workers']} workers, "
        f"{result['runs']} runs; learned costs: from the arrival run, ±{result['noise']:.0%} "
        f"({result['client']}, {result['machine']})",
        f"{'consumer':<17} {'sent':<14} {'÷LB per run':<40} {'median':>6} {'worst':>6} {'÷greedy':>7} "
        f"{'idle ms/msg':>11}  target",
    ]
    for kind, orders in result["kinds"].items():
        for mode, m in orders.items():
            per_run = " ".join(f"{x['makespan_over_lb']:.3f}" for x in m["runs"])
            target = "" if m["target_worst_over_lb"] is None else (
                f"worst <= {m['target_worst_over_lb']}: {'met' if m['target_met'] else 'NOT met'}")
            lines.append(f"{kind:<17} {mode:<14} {per_run:<40} {m['median_over_lb']:>6.3f} {m['worst_over_lb']:>6.3f} "
                         f"{m['median_over_greedy']:>7.3f} {m['median_idle_per_message_ms']:>11.1f}  {target}")
    lines.append("÷greedy: over the greedy schedule of the measured handler times in the order sent (LPT for "
                 "longest first: at LB); idle ms/msg: worker-time outside handlers per message, the hand-off")
    lines.append(f"load average before/after: {result['loadavg']['before']} / {result['loadavg']['after']}")
    return "\n".join(lines)


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
        result = run_order_bench(quick=bool(getattr(args, "quick", False)), runs=runs or 5, progress=say)
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
                   help=f"--orders: comma-separated consumers, any of {','.join(MODES)} (default %(default)s)")
    p.add_argument("--prefetch", type=int, default=1, help="--orders, kind prefetch: its buffer (default 1)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.member:
        try:
            return _member(json.loads(args.member), sys.stdout, sys.stdin)
        except Exception as exc:  # noqa: BLE001 - told to the coordinator, which fails loudly
            print(json.dumps({"error": repr(exc)}), flush=True)
            return 1
    if args.runs is not None and args.runs < 1:
        p.error(f"--runs must be at least 1, got {args.runs}")
    kw = {"messages": args.messages, "instances": args.instances, "workers": args.workers, "quick": args.quick,
          "progress": lambda s: print(s, file=sys.stderr, flush=True)}
    if args.orders:
        try:
            kinds = check_kinds(args.kinds.split(","), args.prefetch)
        except ValueError as exc:
            p.error(str(exc))
        result = run_order_bench(runs=args.runs or 5, kinds=kinds, prefetch=args.prefetch, **kw)
        print(json.dumps(result) if args.json else format_order_bench(result))
        return 0
    result = run_fleet_bench(runs=args.runs or 3, **kw)
    print(json.dumps(result) if args.json else format_fleet_bench(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
