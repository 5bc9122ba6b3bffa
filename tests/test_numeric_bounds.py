"""One rule per kind of number, held by every public parameter of that kind (issue #30, the adversarial review).

The review found a finite timeout (1e10) overflowing ``threading`` in ``stop()``, ``stop_timeout=``,
``wait()`` and ``DemandPushConsumer(shutdown_timeout=)``, and ``prefetch=nan``, ``ack_threads=1.5``
and ``consumption_thread_count=nan`` passing construction. Each was one parameter of a kind its
siblings share, so the rule lives once per kind in :mod:`tracer.bounds`, and this test finds every
public numeric parameter (the census's discovery, ``tests/test_numeric_census.py``) and holds it
to its kind's rule:

* **timeout** (a call may wait this long): None, 0, 1e10, 10**400 and ``math.inf`` all work — the
  wait really waits (something it waits for ends 0.2 s later) and no thread dies of an
  ``OverflowError``; NaN is a ``ValueError`` at the call; a negative one a ``ValueError``, or "do
  not wait" where the call says so; ``"1"`` a ``TypeError``.
* **count** (threads, messages, a buffer): 1.5, NaN, True and one below the minimum are a
  ``ValueError``, ``"2"`` a ``TypeError``; 10**400 works or is a ``ValueError``.
* **seconds** (a duration that is not a wait): NaN, ``math.inf`` and 10**400 are a ``ValueError``.

A new numeric parameter fails here until it is given a kind (and a builder) or a reason.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from test_numeric_census import EXEMPT, _numeric_parameters  # the census's discovery and its reasons

from tracer import AsyncDispatcher, ConsumeLoop, Dispatcher, ManualClock, MessageTracer
from tracer.clients.consume_options import (
    MIN_RENEW_MARGIN_S,
    DispatchOptions,
    FlowOptions,
    LeaseOptions,
    exponential_backoff,
    whole_seconds,
)
from tracer.dispatch import Aggressive, CostAware, DispatchMetrics, Random, RoundRobin
from tracer.embedded import EmbeddedBroker, FilterExpression, Message, Producer, SimpleConsumer

RELEASE_S = 0.2  # what each timeout's wait waits for ends this long after the call begins
HANG_S = 20.0  # far beyond any call here: one still running is a hang

Build = Callable[[object], object]


# -- builders: each calls the parameter with the value, with something to wait for when it waits --
def _consumer(n: int = 0) -> SimpleConsumer:
    broker = EmbeddedBroker(min_receive_invisible=1)
    broker.create_topic("T")
    consumer = SimpleConsumer(broker, "G", {"T": FilterExpression()}, await_duration=0.05)
    consumer.startup()
    producer = Producer(broker, ["T"])
    producer.startup()
    for i in range(n):
        m = Message()
        m.topic, m.body = "T", f"m{i}".encode()
        producer.send(m)
    return consumer


def _released() -> threading.Event:
    gate = threading.Event()
    threading.Timer(RELEASE_S, gate.set).start()
    return gate


def _running_loop(**kw: Any) -> tuple[ConsumeLoop, threading.Thread, threading.Event]:
    """A loop running one handler that ends once the returned event is set."""
    gate = threading.Event()
    loop = ConsumeLoop(_consumer(1), lambda m: gate.wait(HANG_S), invisible_duration=5, workers=1, **kw)
    t = threading.Thread(target=loop.run, daemon=True)
    t.start()
    assert loop.wait(lambda s: s.received >= 1, timeout=HANG_S)
    return loop, t, gate


def _loop_stop(v: object) -> object:
    loop, t, gate = _running_loop()
    threading.Timer(RELEASE_S, gate.set).start()
    try:
        return loop.stop(timeout=v)  # type: ignore[arg-type]
    finally:
        gate.set()
        loop.stop(timeout=HANG_S)


def _loop_wait(v: object) -> object:
    loop, t, gate = _running_loop()
    threading.Timer(RELEASE_S, gate.set).start()
    try:
        return loop.wait(lambda s: s.acked >= 1, timeout=v)  # type: ignore[arg-type]
    finally:
        gate.set()
        loop.stop(timeout=HANG_S)


def _loop_option(name: str) -> Build:
    def build(v: object) -> object:
        loop, t, gate = _running_loop(**{name: v})
        threading.Timer(RELEASE_S, gate.set).start()
        loop.stop()
        t.join(HANG_S)
        assert not t.is_alive(), "run() did not return"
        return loop
    return build


def _options(cls: Any, name: str, **extra: object) -> Build:
    return lambda v: cls(**{name: v}, **extra)


def _dispatcher_wait(method: str) -> Build:
    def call(v: object) -> object:
        gate = _released()
        d = Dispatcher(lambda m: gate.wait(HANG_S), workers=1, policy=Aggressive(max_parked=0))
        try:
            d.submit("busy")
            if method == "submit":  # the pool is full: it waits for the room the handler frees
                return d.submit("x", timeout=v)  # type: ignore[arg-type]
            if method == "close":
                return d.close(timeout=v)  # type: ignore[arg-type]
            return getattr(d, method)(timeout=v)
        finally:
            gate.set()
            d.close(timeout=HANG_S)
    return call


def _dispatcher_handler_timeout(v: object) -> object:
    d = Dispatcher(lambda m: threading.Event().wait(RELEASE_S), workers=1, handler_timeout=v)  # type: ignore[arg-type]
    try:
        d.submit("x")
        return d.wait_idle(timeout=HANG_S)  # the watchdog waits for the handler's deadline meanwhile
    finally:
        d.close(timeout=HANG_S)


def _async_wait(method: str | None) -> Build:
    def call(v: object) -> object:
        async def body() -> object:
            gate = asyncio.Event()

            async def handler(m: object) -> None:
                await gate.wait()

            asyncio.get_running_loop().call_later(RELEASE_S, gate.set)
            if method is None:  # handler_timeout: its timer runs while the handler waits
                d = AsyncDispatcher(handler, workers=1, handler_timeout=v)  # type: ignore[arg-type]
                await d.submit("x")
                return await d.wait_idle(timeout=HANG_S)
            d = AsyncDispatcher(handler, workers=1, policy=Aggressive(max_parked=0))
            try:
                await d.submit("busy")
                if method == "submit":
                    return await d.submit("x", timeout=v)  # type: ignore[arg-type]
                if method == "close":
                    return await d.close(timeout=v)  # type: ignore[arg-type]
                return await getattr(d, method)(timeout=v)
            finally:
                gate.set()
                await d.close(timeout=HANG_S)
        return asyncio.run(body())
    return call


def _async_workers(v: object) -> object:
    async def noop(m: object) -> None:
        return None

    async def body() -> object:
        d = AsyncDispatcher(noop, workers=v)  # type: ignore[arg-type]
        await d.close(timeout=HANG_S)
        return d
    return asyncio.run(body())


def _dispatcher_workers(v: object) -> object:
    d = Dispatcher(lambda m: None, workers=v)  # type: ignore[arg-type]
    d.close(timeout=HANG_S)
    return d


class _Listener:
    def consume(self, m: object) -> None:
        return None


def _demand_push(name: str) -> Build:
    def build(v: object) -> object:
        from tracer.clients.demandpush import DemandPushConsumer

        broker = EmbeddedBroker(min_receive_invisible=1)
        broker.create_topic("T")
        kw: dict[str, object] = {"consumption_thread_count": 1, "invisible_duration": 5, name: v}
        dp = DemandPushConsumer(broker, "G", _Listener(), {"T": None}, **kw)  # type: ignore[arg-type]
        dp.startup()
        dp.shutdown()  # shutdown_timeout: it drains within it; no thread dies
        return dp
    return build


def priority_job(levels: object) -> Any:
    from tracer.clients.producer import TracedProducer
    from tracer.embedded import EmbeddedBroker, Producer

    return TracedProducer(Producer(EmbeddedBroker(), ["T"]), MessageTracer()).send_job(
        [], cost=lambda m: 1.0, priority_levels=levels)  # type: ignore[arg-type]


def _policy(cls: Any, name: str) -> Build:
    return lambda v: cls(**{name: v}).scheduler(2)


# (where, parameter) -> (kind, builder); "timeout-" is a timeout whose negative value means "do not wait"
PARAMETERS: dict[tuple[str, str], tuple[str, Build]] = {
    ("tracer.clients.consume.ConsumeLoop.stop", "timeout"): ("timeout", _loop_stop),
    ("tracer.clients.consume.ConsumeLoop.wait", "timeout"): ("timeout", _loop_wait),
    ("tracer.clients.consume_options.DispatchOptions", "workers"): ("count", _options(DispatchOptions, "workers")),
    ("tracer.clients.consume_options.DispatchOptions", "handler_timeout"): ("timeout+", _loop_option("handler_timeout")),
    ("tracer.clients.consume_options.FlowOptions", "stop_timeout"): ("timeout", _loop_option("stop_timeout")),
    **{("tracer.clients.consume_options.FlowOptions", n): ("count", _options(FlowOptions, n))
       for n in ("max_batch", "prefetch", "resync_after", "ack_threads")},
    ("tracer.clients.consume_options.LeaseOptions", "renew_threads"): ("count", _options(LeaseOptions, "renew_threads")),
    **{("tracer.clients.consume_options.LeaseOptions", n): ("seconds", _options(LeaseOptions, n))
       for n in ("invisible_duration", "hang_grace")},
    ("tracer.clients.consume_options.LeaseOptions", "renew_margin"):
        ("seconds", _options(LeaseOptions, "renew_margin", invisible_duration=600)),
    ("tracer.clients.consume_options.exponential_backoff", "attempt"): ("count", lambda v: exponential_backoff(v)),  # type: ignore[arg-type]
    ("tracer.clients.consume_options.exponential_backoff", "base"): ("seconds", lambda v: exponential_backoff(3, base=v)),  # type: ignore[arg-type]
    ("tracer.clients.consume_options.exponential_backoff", "cap"): ("seconds", lambda v: exponential_backoff(3, cap=v)),  # type: ignore[arg-type]
    ("tracer.clients.consume_options.whole_seconds", "seconds"): ("seconds", lambda v: whole_seconds(v)),  # type: ignore[arg-type]
    ("tracer.dispatch.engine.Dispatcher", "workers"): ("count", _dispatcher_workers),
    ("tracer.dispatch.engine.Dispatcher", "handler_timeout"): ("timeout+", _dispatcher_handler_timeout),
    **{("tracer.dispatch.engine.Dispatcher." + m, "timeout"): ("timeout-" if m != "close" else "timeout",
                                                              _dispatcher_wait(m))
       for m in ("submit", "close", "wait_for_free_slot", "wait_idle")},
    ("tracer.dispatch.aio.AsyncDispatcher", "workers"): ("count", _async_workers),
    ("tracer.dispatch.aio.AsyncDispatcher", "handler_timeout"): ("timeout+", _async_wait(None)),
    **{("tracer.dispatch.aio.AsyncDispatcher." + m, "timeout"): ("timeout-" if m != "close" else "timeout",
                                                                _async_wait(m))
       for m in ("submit", "close", "wait_for_free_slot", "wait_idle")},
    ("tracer.dispatch.policy.Aggressive", "max_parked"): ("count", _policy(Aggressive, "max_parked")),
    ("tracer.dispatch.policy.CostAware", "window"): ("count", _policy(CostAware, "window")),
    ("tracer.dispatch.policy.RoundRobin", "buffer"): ("count", _policy(RoundRobin, "buffer")),
    ("tracer.dispatch.policy.Random", "buffer"): ("count", _policy(Random, "buffer")),
    ("tracer.dispatch.policy.Random", "seed"): ("count", _policy(Random, "seed")),
    ("tracer.dispatch.metrics.DispatchMetrics", "refresh_interval"):
        ("seconds", lambda v: DispatchMetrics(registry=__import__("prometheus_client").CollectorRegistry(),
                                              refresh_interval=v)),  # type: ignore[arg-type]
    **{("tracer.clients.demandpush.DemandPushConsumer", n): ("count", _demand_push(n))
       for n in ("consumption_thread_count", "max_cache_message_count", "max_cache_message_size")},
    ("tracer.clients.demandpush.DemandPushConsumer", "invisible_duration"): ("seconds", _demand_push("invisible_duration")),
    ("tracer.clients.demandpush.DemandPushConsumer", "handler_timeout"): ("timeout+", _demand_push("handler_timeout")),
    ("tracer.clients.demandpush.DemandPushConsumer", "shutdown_timeout"): ("timeout", _demand_push("shutdown_timeout")),
    ("tracer.clients.demandpush.DemandPushConsumer", "startup_timeout"): ("timeout+", _demand_push("startup_timeout")),
    ("tracer.path.clock.ManualClock.advance_s", "seconds"): ("seconds", lambda v: ManualClock().advance_s(v)),  # type: ignore[arg-type]
    ("tracer.telemetry.tracer.MessageTracer", "capture_body"): ("count", lambda v: MessageTracer(capture_body=v)),  # type: ignore[arg-type]
    ("tracer.clients.producer.TracedProducer.send_job", "priority_levels"): ("count", lambda v: priority_job(v)),
    ("tracer.dispatch.cost.job_priorities", "levels"):
        ("count", lambda v: __import__("tracer.dispatch.cost", fromlist=["x"]).job_priorities([1.0], v)),
}

# Discovered, but not a limit of the loop or the dispatcher: left to the census (and its EXEMPT)
ELSEWHERE: dict[tuple[str, str], str] = {
    ("tracer.embedded.EmbeddedBroker", "min_receive_invisible"): "a test double's setting, in the census",
    ("tracer.embedded.EmbeddedBroker", "max_invisible"): "a test double's setting, in the census",
    ("tracer.embedded.EmbeddedBroker.create_topic", "queues"): "a test double's setting, in the census",
    ("tracer.path.clock.ManualClock.step_wall", "ns"): "a test clock's step in int ns (either way), not a limit",
}

# value name -> value; what each must do depends on the kind (_expected)
VALUES: dict[str, object] = {
    "none": None, "zero": 0, "negative": -1, "nan": math.nan, "inf": math.inf, "finite-huge": 1e10,
    "int-huge": 10**400, "fraction": 1.5, "bool": True, "string": "2",
}
KIND_VALUES = {
    "timeout": ("none", "zero", "negative", "nan", "inf", "finite-huge", "int-huge", "string"),
    "count": ("negative", "nan", "fraction", "bool", "string", "int-huge"),
    "seconds": ("nan", "inf", "int-huge", "string"),
}


def _expected(kind: str, value: str) -> str:
    """'ok', 'ValueError', 'TypeError', or 'ok|ValueError' (a huge count may be refused or work)."""
    base = kind.rstrip("+-")
    if value == "string":
        return "TypeError"
    if base == "timeout":
        if value == "nan" or (value == "negative" and not kind.endswith("-")) or (value == "zero" and kind.endswith("+")):
            return "ValueError"
        return "ok"
    if base == "count":
        return "ok|ValueError" if value in ("int-huge", "negative") else "ValueError"
    return "ValueError"


def test_every_public_numeric_parameter_has_a_kind() -> None:
    found = _numeric_parameters()
    mine = set(PARAMETERS) | set(ELSEWHERE) | set(EXEMPT)
    assert not found - mine, f"give these a kind in PARAMETERS (or a reason): {sorted(found - mine)}"
    assert not (set(PARAMETERS) | set(ELSEWHERE)) - found, "listed but no longer found (renamed?)"


def _cases() -> Iterator[Any]:
    for where, (kind, _) in sorted(PARAMETERS.items()):
        for value in KIND_VALUES[kind.rstrip("+-")]:
            yield pytest.param(where, value, id=f"{'.'.join(where[0].split('.')[-2:])}.{where[1]}={value}")


@pytest.fixture
def dead_threads() -> Iterator[list[BaseException]]:
    """The exceptions that ended a thread during the test (an OverflowError in a watchdog, a keeper)."""
    died: list[BaseException] = []
    before = threading.excepthook

    def hook(args: Any) -> None:
        died.append(args.exc_value)
        before(args)

    threading.excepthook = hook
    try:
        yield died
    finally:
        threading.excepthook = before


@pytest.mark.parametrize(("where", "value"), list(_cases()))
def test_a_numeric_parameter_follows_its_kind(where: tuple[str, str], value: str,
                                              dead_threads: list[BaseException]) -> None:
    kind, build = PARAMETERS[where]
    out: list[BaseException | None] = []

    def run() -> None:
        try:
            build(VALUES[value])
            out.append(None)
        except BaseException as exc:  # noqa: BLE001 - classified below
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(HANG_S)
    assert out, f"{where} = {value}: still running after {HANG_S:g} s (a hang)"
    got = "ok" if out[0] is None else type(out[0]).__name__
    want = _expected(kind, value)
    assert got in want.split("|"), f"{where} = {value} ({kind}): {got} {out[0]!r}, expected {want}"
    if out[0] is not None:
        assert "\n" not in str(out[0]).strip(), f"a one-line error, got {out[0]!s}"
    assert not dead_threads, f"{where} = {value}: a thread died of {dead_threads!r}"


def test_the_smallest_renew_margin_is_three_keeper_ticks() -> None:
    """renew_margin=0.001 was below the keeper's 50 ms tick (adversarial 15): refused now, and the
    floor is what the keeper can honour (it looks at every lease 3 times within the margin)."""
    with pytest.raises(ValueError, match="renew_margin"):
        LeaseOptions(invisible_duration=1, renew_margin=0.001)
    loop = ConsumeLoop(_consumer(), lambda m: None, invisible_duration=1, renew_margin=MIN_RENEW_MARGIN_S)
    try:
        assert loop._tick() * 3 <= MIN_RENEW_MARGIN_S + 1e-9
    finally:
        loop.stop(timeout=1)
