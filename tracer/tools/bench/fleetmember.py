"""The fleet bench's members: the job into a fresh topic, C member processes, one run of one kind.

Each member (``python -m tracer.tools.bench.fleet --member CONFIG``) consumes with the kind it is
told (:data:`~tracer.tools.bench.fleetjob.KINDS`), reports every handled message and its
occupancy at exit; :func:`run_fleet` starts them, says go at one instant and collects a
:class:`~tracer.tools.bench.fleetjob.FleetRun`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from typing import IO, Any, Callable, Sequence

from ...dispatch.costtable import CostTable
from ...path.names import JOB_ORDERS
from . import rmq_admin
from .fleetjob import ENDPOINT, KINDS, PREFETCH, PRIORITY_QUEUES, QUEUES, FleetRun, Handled

__all__ = ["member_main", "run_fleet"]


def _produce(topic: str, durations: Sequence[float], endpoint: str, order: str | None = None,
             costs: Sequence[float] | CostTable | None = None, priority_levels: int | None = None) -> list[int] | None:
    """The job into ``topic``: with ``order`` through ``TracedProducer.send_job`` (one by one, in
    that order, by ``costs``: a cost per message or a table keyed by the message's index; with
    ``priority_levels`` for a PRIORITY topic of that many queues), else all at once with
    ``send_async`` in job order. Returns the message indexes in send order (None: job order)."""
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
            TracedProducer(producer, MessageTracer()).send_job(messages, cost=cost, order=order,
                                                               priority_levels=priority_levels)
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
        self.errors: dict[str, int] = {}  # the loop's errors_by_kind at exit
        self.started_s = 0.0  # from "go" to its consumer's start() returning
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
                self.errors = msg.get("errors", {})
            elif "started_s" in msg:
                self.started_s = float(msg["started_s"])
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
              costs: Sequence[float] | CostTable | None = None, prefetch: int = PREFETCH,
              priority: bool = False) -> FleetRun:
    """Run one job once in ``mode``; see the module docstring. ``linger``: seconds the members stay
    up after the job (so a scraper sees their last values). ``order``: send the job with
    ``send_job`` in this order (by ``costs``, default the true durations); None: all at once.
    ``prefetch``: the ``prefetch`` mode's buffer. ``priority`` (with ``order``): the topic is a
    PRIORITY topic of :data:`PRIORITY_QUEUES` queues and ``send_job`` gives every message its
    priority, so the broker hands the job out in exactly the order sent.

    Raises:
        ValueError: an unknown mode or order, fewer than one instance or worker, ports not one per instance.
        RuntimeError: a member failed, or the job did not finish within ``timeout`` seconds.
    """
    if mode not in KINDS:
        raise ValueError(f"mode must be one of {KINDS}, got {mode!r}")
    if instances < 1 or workers < 1:
        raise ValueError(f"instances and workers must be at least 1, got {instances} and {workers}")
    if metrics_ports is not None and len(metrics_ports) != instances:
        raise ValueError(f"metrics_ports must name one port per instance ({instances}), got {len(metrics_ports)}")
    if order is not None and order not in JOB_ORDERS:
        raise ValueError(f"order must be one of {JOB_ORDERS}, got {order!r}")
    if priority and order is None:
        raise ValueError("a PRIORITY topic's job is sent with send_job: give order=")
    admin = rmq_admin("fleet")
    run_id = uuid.uuid4().hex[:8]
    topic = f"rmqtrace-fleet-{run_id}"
    group = f"rmqtrace-fleet-{mode.replace('_', '-')}-{run_id}"
    admin.create_topic(topic, queues=PRIORITY_QUEUES if priority else QUEUES, priority=priority)
    admin.create_group(group)
    sent = _produce(topic, durations, endpoint, order, costs, PRIORITY_QUEUES if priority else None)
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
        run.errors.append(m.errors)
        run.started_s.append(m.started_s)
    return run


# -- the member process ------------------------------------------------------------------------------
def member_main(config: dict[str, Any], out: IO[str], inp: IO[str]) -> int:
    """One member process: consume as ``config["mode"]`` says (a kind of :data:`KINDS`) until told to stop."""
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
    elif mode in ("push_replacement", "push_replacement_ahead"):
        from ...clients.demandpush import DemandPushConsumer

        class Plain(rmq.MessageListener):  # type: ignore[misc,name-defined]
            def consume(self, message: Any) -> Any:
                work(message.body)
                return rmq.ConsumeResult.SUCCESS

        # the push consumer's line with one word changed; it traces itself (no TracedListener)
        replacement = DemandPushConsumer(cfg, group, Plain(), {topic: rmq.FilterExpression()},
                                         consumption_thread_count=workers, tracer=tracer,
                                         receive_ahead=mode.endswith("_ahead"))
        start, close = replacement.startup, replacement.shutdown

        def loop_stats() -> Any:
            return replacement.loop.statistics() if replacement.loop is not None else None
    else:
        consumer = rmq.SimpleConsumer(cfg, group, {topic: rmq.FilterExpression()}, await_duration=1)
        consumer.startup()
        settled = getattr(consumer, "_init_settings_event", None)  # 5.1.2: startup() does not wait for it
        if settled is not None:
            settled.wait(15)
        loop = ConsumeLoop(consumer, lambda msg: work(msg.body), tracer=tracer, policy="aggressive",
                           workers=workers, prefetch=int(config.get("prefetch", PREFETCH)) if mode == "prefetch" else 0,
                           invisible_duration=60, receive_ahead=mode.endswith("_ahead"))
        runner = threading.Thread(target=loop.run, name="fleet-loop", daemon=True)

        def close_loop() -> None:
            loop.stop()
            runner.join(30)
            consumer.shutdown()

        start, close = runner.start, close_loop

        def loop_stats() -> Any:
            return loop.statistics()
    emit({"ready": True})
    for line in inp:
        cmd = line.strip()
        if cmd == "go":
            began = time.monotonic()
            start()
            # a push replacement starts its client here: its settings wait is in the job's time
            emit({"started_s": round(time.monotonic() - began, 3)})
        elif cmd == "stop":
            break
    try:
        close()
    except Exception as exc:  # noqa: BLE001 - the report below matters more than a clean shutdown
        emit({"error": f"shutdown: {exc!r}"})
    occupancy.close()
    s = occupancy.statistics()
    stats = loop_stats() if mode != "push_consumer" else None
    emit({"occupancy": {"busy_s": s.busy_s, "idle_s": s.idle_s, "hol_s": s.hol_s, "holding_s": s.holding_s},
          "errors": dict(stats.errors_by_kind) if stats is not None else {}})
    return 0
