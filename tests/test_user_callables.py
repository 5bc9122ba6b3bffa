"""Every place a user hands rmqtrace a callable refuses one that would never run.

An ``async def`` (or a generator) called like a function only builds a coroutine: a handler
"succeeds" without running and its message is acked, a listener's message fails for ever, an
``until=`` is truthy at once. Round 3 fixed that for the dispatcher's and the loop's own
arguments; the push seams (5.x listener, 2.x callback, the push-consumer replacement) were built
the same way and missed it. This test finds every public parameter that takes a callable, so a new
one cannot be added without saying whether it is checked (and proving it) or why not.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import math
import pkgutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import tracer
from tracer import AsyncDispatcher, ConsumeLoop, Dispatcher, MessageTracer
from tracer.clients.consume_options import DispatchOptions, FlowOptions
from tracer.clients.legacy import traced_callback
from tracer.embedded import EmbeddedBroker, SimpleConsumer

rmq = pytest.importorskip("rocketmq")


async def _async_fn(*a: Any) -> None:  # pragma: no cover - refused before it could run
    return None


def _gen_fn(*a: Any) -> Any:  # pragma: no cover - refused before it could run
    yield a


async def _async_gen_fn(*a: Any) -> Any:  # pragma: no cover - refused before it could run
    yield a


class _AsyncCall:
    async def __call__(self, *a: Any) -> None:  # pragma: no cover - refused before it could run
        return None


def _plain(*a: Any) -> Any:
    return rmq.ConsumeResult.SUCCESS


WRONG = {"async": _async_fn, "generator": _gen_fn, "async-generator": _async_gen_fn, "async-__call__": _AsyncCall()}


def _listener(fn: Callable[..., Any]) -> Any:
    """A ``MessageListener`` whose ``consume`` is ``fn`` (as a method: what the client calls)."""
    return type("Listener", (rmq.MessageListener,), {"consume": lambda self, m: fn(m)} if fn is _plain
                else {"consume": fn if not isinstance(fn, _AsyncCall) else _AsyncCall.__call__})()


def _consumer() -> SimpleConsumer:
    broker = EmbeddedBroker()
    broker.create_topic("T")
    consumer = SimpleConsumer(broker, "G", {"T": None})
    consumer.startup()
    return consumer


@contextmanager
def _built(obj: Any) -> Iterator[Any]:
    try:
        yield obj
    finally:
        if isinstance(obj, ConsumeLoop):  # never run: its dispatcher is stopped here or never
            obj.dispatcher.close()
        for close in ("close", "shutdown"):
            fn = getattr(obj, close, None)
            if callable(fn) and not inspect.iscoroutinefunction(fn):  # an AsyncDispatcher closed itself
                try:
                    fn()
                except Exception:  # noqa: BLE001 - only the construction is under test
                    pass
                break


def _loop(**kw: Any) -> ConsumeLoop:
    return ConsumeLoop(_consumer(), kw.pop("handler", _plain), **kw)


def _on_loop(call: Callable[[ConsumeLoop], Any]) -> Any:
    """``call(loop)`` on a new loop, whose dispatcher is closed after: a loop that is never run
    (or whose run() refused its argument) has no other way to stop its worker threads."""
    loop = _loop()
    try:
        return call(loop)
    finally:
        loop.dispatcher.close()


def _async_dispatcher(fn: Callable[..., Any], where: str) -> Any:
    async def build() -> Any:
        kw = {} if where == "handler" else {where: fn}
        d = AsyncDispatcher(fn if where == "handler" else _async_fn, workers=1, **kw)
        await d.close()
        return d
    return asyncio.run(build())


def _demand_push(**kw: Any) -> Any:
    from tracer.clients.demandpush import DemandPushConsumer

    listener = kw.pop("message_listener", _listener(_plain))
    return DemandPushConsumer(rmq.ClientConfiguration("127.0.0.1:1", rmq.Credentials()), "G", listener,
                              {"T": rmq.FilterExpression()}, **kw)


def _pipeline(fn: Callable[..., Any]) -> None:
    from tracer.testing import traced_pipeline

    with traced_pipeline(fn):
        pass


def _send_job(**kw: Any) -> Any:
    from tracer.clients.producer import TracedProducer
    from tracer.embedded import Producer

    broker = EmbeddedBroker()
    broker.create_topic("T")
    return TracedProducer(Producer(broker, ["T"]), MessageTracer()).send_job([], **{"cost": _one, **kw})


def _legacy_send_job(**kw: Any) -> Any:
    from tracer.clients.legacy import TracedLegacyProducer

    return TracedLegacyProducer(object(), MessageTracer()).send_job([], **{"cost": _one, **kw})


def _one(m: Any) -> float:
    return 1.0


def _costs(module: str, name: str, cost: Callable[..., Any] = _one, key: Callable[..., Any] | None = None) -> Any:
    fn = getattr(importlib.import_module(module), name)
    return fn([], cost, key=key) if key is not None else fn([], cost)


def _table_call(name: str, fn: Callable[..., Any]) -> Any:
    import tempfile

    from tracer.dispatch import cost, costtable

    if name == "table_cost":
        return cost.table_cost(costtable.CostTable({}), fn)
    if name == "CostTable":
        return costtable.CostTable({}, fn)
    if name == "with_group":
        return costtable.CostTable({}).with_group(fn)
    if name == "learn_costs":
        return costtable.learn_costs([], group=fn)
    text = '{"format": "rmqtrace.costs", "version": 1, "costs": {}}'
    if name == "parse_costs":
        return costtable.parse_costs(text, group=fn)
    with tempfile.TemporaryDirectory() as folder:
        path = f"{folder}/costs.json"
        with open(path, "w") as f:
            f.write(text)
        return costtable.load_costs(path, group=fn)


# Every public parameter that takes a callable and is checked: (where) -> build it with `fn`.
def _ahead(fn: Callable[..., Any]) -> object:
    from tracer.clients.ahead import ReceiveAhead

    return ReceiveAhead(fn)


CHECKED: dict[tuple[str, str], Callable[[Callable[..., Any]], object]] = {
    ("tracer.clients.consume.ConsumeLoop", "handler"): lambda fn: _loop(handler=fn),
    ("tracer.clients.ahead.ReceiveAhead", "cost"): lambda fn: _ahead(fn),
    ("tracer.clients.consume.ConsumeLoop.run", "until"): lambda fn: _on_loop(lambda loop: loop.run(until=fn)),
    ("tracer.clients.consume.ConsumeLoop.wait", "predicate"): lambda fn: _on_loop(lambda loop: loop.wait(fn, timeout=0)),
    ("tracer.clients.consume_options.DispatchOptions", "key"): lambda fn: DispatchOptions(key=fn),
    ("tracer.clients.consume_options.DispatchOptions", "cost"): lambda fn: DispatchOptions(cost=fn),
    ("tracer.clients.consume_options.FlowOptions", "retry_backoff"): lambda fn: FlowOptions(retry_backoff=fn),
    ("tracer.clients.demandpush.DemandPushConsumer", "message_listener"):
        lambda fn: _demand_push(message_listener=_listener(fn)),
    ("tracer.clients.demandpush.DemandPushConsumer", "retry_backoff"): lambda fn: _demand_push(retry_backoff=fn),
    ("tracer.clients.legacy.traced_callback", "callback"): lambda fn: traced_callback(fn, MessageTracer()),
    ("tracer.clients.official.TracedListener", "listener"):
        lambda fn: __import__("tracer.clients.official", fromlist=["x"]).TracedListener(_listener(fn), MessageTracer()),
    ("tracer.dispatch.engine.Dispatcher", "handler"): lambda fn: Dispatcher(fn, workers=1),
    ("tracer.dispatch.engine.Dispatcher", "key"): lambda fn: Dispatcher(_plain, workers=1, key=fn),
    ("tracer.dispatch.engine.Dispatcher", "cost"): lambda fn: Dispatcher(_plain, workers=1, cost=fn),
    ("tracer.dispatch.engine.Dispatcher", "on_done"): lambda fn: Dispatcher(_plain, workers=1, on_done=fn),
    ("tracer.dispatch.aio.AsyncDispatcher", "key"): lambda fn: _async_dispatcher(fn, "key"),
    ("tracer.dispatch.aio.AsyncDispatcher", "cost"): lambda fn: _async_dispatcher(fn, "cost"),
    ("tracer.dispatch.aio.AsyncDispatcher", "on_done"): lambda fn: _async_dispatcher(fn, "on_done"),
    ("tracer.testing.traced_pipeline", "handler"): _pipeline,
    ("tracer.telemetry.tracer.MessageTracer", "listeners"): lambda fn: MessageTracer(listeners=[_plain, fn]),
    # MessageTracer's constructor, on the base that holds it
    ("tracer.telemetry.tracercore.TracerCore", "listeners"): lambda fn: MessageTracer(listeners=[_plain, fn]),
    ("tracer.telemetry.exportchild.ChildExportProcessor", "drops"):
        lambda fn: __import__("tracer.telemetry.exportchild", fromlist=["x"]).ChildExportProcessor(drops=fn),
    ("tracer.clients.producer.TracedProducer.send_job", "cost"): lambda fn: _send_job(cost=fn),
    ("tracer.clients.producer.TracedProducer.send_job", "key"): lambda fn: _send_job(key=fn),
    ("tracer.clients.legacy.TracedLegacyProducer.send_job", "cost"): lambda fn: _legacy_send_job(cost=fn),
    ("tracer.clients.legacy.TracedLegacyProducer.send_job", "key"): lambda fn: _legacy_send_job(key=fn),
    ("tracer.clients.producer.ordered_job", "cost"): lambda fn: _costs("tracer.clients.producer", "ordered_job", fn),
    ("tracer.clients.producer.ordered_job", "key"): lambda fn: _costs("tracer.clients.producer", "ordered_job", key=fn),
    ("tracer.dispatch.cost.job_costs", "cost"): lambda fn: _costs("tracer.dispatch.cost", "job_costs", fn),
    ("tracer.dispatch.cost.job_costs", "key"): lambda fn: _costs("tracer.dispatch.cost", "job_costs", key=fn),
    ("tracer.dispatch.cost.table_cost", "key"): lambda fn: _table_call("table_cost", fn),
    ("tracer.dispatch.costtable.CostTable", "group"): lambda fn: _table_call("CostTable", fn),
    ("tracer.dispatch.costtable.CostTable.with_group", "group"): lambda fn: _table_call("with_group", fn),
    ("tracer.dispatch.costtable.learn_costs", "group"): lambda fn: _table_call("learn_costs", fn),
    ("tracer.dispatch.costtable.load_costs", "group"): lambda fn: _table_call("load_costs", fn),
    ("tracer.dispatch.costtable.parse_costs", "group"): lambda fn: _table_call("parse_costs", fn),
}

# Checked the other way round: it must be an async def (a plain function would block the loop).
CHECKED_ASYNC = {("tracer.dispatch.aio.AsyncDispatcher", "handler")}

# Not checked, and why: ours to call with our own functions, or a value the library reads at once
# (a clock, a progress printer), where a wrong kind fails loudly on first use instead of silently.
EXEMPT = {
    ("tracer.clients.consume.ConsumeLoop", "monotonic"): "a clock: a coroutine fails at the first subtraction",
    ("tracer.clients.consume.ConsumeLoop", "wall"): "a clock: a coroutine fails at the first subtraction",
    ("tracer.clients.lease.LeaseKeeper", "monotonic"): "a clock (internal)",
    ("tracer.clients.lease.LeaseKeeper", "interrupted"): "the loop's own _interrupted (internal)",
    ("tracer.clients.each.each_then_raise", "call"): "internal: the loop's own settle or renewal of one message",
    ("tracer.embedded.EmbeddedBroker", "monotonic"): "a clock: tests inject a manual one",
    ("tracer.embedded.EmbeddedBroker", "wall_ms"): "a clock: tests inject a manual one",
    ("tracer.clients.probe.ProbeSender", "monotonic"): "a clock",
    ("tracer.clients.probe.ProbeSender", "sleep"): "a sleeper the CLI passes",
    ("tracer.clients.probe.ProbeSender", "message_factory"): "builds a message: a coroutine fails at send",
    ("tracer.clients.probe.skip_probes", "handler"): "returns a wrapper; whoever runs it checks it "
                                                    "(__wrapped__ is followed: see test_dispatch_incident)",
    ("tracer.clients.legacy.traced_legacy_send", "send"): "the client's own send method",
    ("tracer.clients.producer.send_ordered", "send"): "send_job's own lambda around the traced send",
    ("tracer.clients.producer.send_ordered", "mark"): "send_job's own lambda setting the order property",
    ("tracer.clients.producer.send_ordered", "unmark"): "send_job's own clear_priority",
    ("tracer.clients.producer.check_markable", "mark"): "send_job's own setter lookup (_setter, the 2.x one)",
    ("tracer.clients.producer.check_markable", "key"): "send_job's key=, checked by job_costs before this runs",
    ("tracer.clients.producer.plan_priorities", "key"): "send_job's key=, checked by job_costs before this runs",
    ("tracer.clients.producer.plan_priorities", "refusal"): "send_job's own priority_refusal (the 2.x one)",
    ("tracer.dispatch.cost.which_message", "key"): "only names a message in an error: a raising or junk answer "
        "is left out of the name (the cost's own error says key='s failure)",
    ("tracer.clients.producer.traced_send", "send"): "the client's own send method",
    ("tracer.clients.producer.traced_send_async", "send_async"): "the client's own send_async method",
    ("tracer.clients.listener.traced_consume", "call"): "internal: the seams above check what they pass",
    ("tracer.callables.holds", "predicate"): "internal: the guard itself, called with until= and wait() predicates",
    ("tracer.config.CountingExporter", "on_taken"): "internal: the config's own counter",
    ("tracer.dispatch.core.Core", "key"): "internal: both engines check before they build a Core",
    ("tracer.dispatch.core.Core", "cost"): "internal: both engines check before they build a Core",
    ("tracer.dispatch.core.Core", "on_done"): "internal: both engines check before they build a Core",
    ("tracer.dispatch.cost.longest_first", "cost"): "a sort key applied at once: a coroutine fails to compare",
    ("tracer.dispatch.scheduler.BufferedScheduler", "draw"): "internal: the random policy's draw",
    ("tracer.path.propagation.PropagationErrors", "on_count"): "internal: the tracer's metrics hook",
    ("tracer.path.propagation.inject", "set_property"): "the client's own property setter",
    ("tracer.report.fleetread.read_jaeger_fleet", "get"): "an HTTP getter tests inject",
    ("tracer.report.sources.read_span_path", "read"): "internal: the report's own readers",
    ("tracer.telemetry.hold.HoldingSpanProcessor", "on_dropped"): "internal: the tracer's metrics hook",
    ("tracer.telemetry.hold.HoldingSpanProcessor", "on_policy_dropped"): "internal: the tracer's metrics hook",
    ("tracer.dispatch.accrual.Accrual", "now"): "internal: the core passes its own monotonic clock",
    ("tracer.telemetry.occupancy.Occupancy", "on_close"): "internal: its collector's flush (OccupancyMetrics.track)",
    ("tracer.telemetry.keep.KeepPolicy.decide", "settle"): "internal: the hold's release",
    ("tracer.telemetry.operations.ConsumerOperations.receive", "call"): "the client's own receive",
    ("tracer.telemetry.operations.ConsumerOperations.receive", "traces"): "internal: the seam's trace starter",
    ("tracer.telemetry.operations.ConsumerOperations.receive_async", "call"): "the client's own receive_async",
    ("tracer.telemetry.operations.ConsumerOperations.receive_async", "then"): "internal",
    ("tracer.telemetry.operations.ConsumerOperations.receive_async", "traces"): "internal",
    ("tracer.telemetry.operations.ConsumerOperations.settle", "call"): "the client's own ack",
    ("tracer.telemetry.registration.Refresher", "flush"): "internal: a collector's own flush",
    ("tracer.telemetry.tracer.MessageTracer.start_send", "set_property"): "the client's own property setter",
    ("tracer.tools.bench.broker.run_broker_bench", "progress"): "the CLI's progress printer",
    ("tracer.tools.bench.dispatch.run_dispatch_bench", "progress"): "the CLI's progress printer",
    ("tracer.tools.bench.fleet.run_fleet_bench", "progress"): "the CLI's progress printer",
    ("tracer.tools.bench.fleetorders.run_order_bench", "progress"): "the CLI's progress printer",
    ("tracer.tools.bench.overhead.run_overhead_bench", "progress"): "the CLI's progress printer",
    ("tracer.tools.demo.run_policy", "on_message"): "the demo's progress printer",
}

_LISTENER_NAMES = ("message_listener", "listener", "callback")


def _callable_parameters() -> set[tuple[str, str]]:
    """(where, parameter) for every parameter of a public (``__all__``) function, class or method
    that is annotated as a callable or named like a listener."""
    found: set[tuple[str, str]] = set()
    for info in pkgutil.walk_packages(tracer.__path__, "tracer."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name, None)
            if inspect.isclass(obj):
                where = f"{obj.__module__}.{obj.__qualname__}"
                # its own methods and those of our bases (MessageTracer's on TracerCore), under its name
                members = {m: f for k in reversed(obj.__mro__) if k.__module__.startswith("tracer.")
                           for m, f in vars(k).items()}
                targets = [(where, obj.__init__)] + [
                    (f"{where}.{m}", f) for m, f in members.items() if not m.startswith("_") and inspect.isfunction(f)]
            elif inspect.isfunction(obj):
                targets = [(f"{obj.__module__}.{obj.__qualname__}", obj)]
            else:
                continue
            for where, fn in targets:
                try:
                    params = inspect.signature(fn).parameters.values()
                except (TypeError, ValueError):
                    continue
                for p in params:
                    if "Callable" in str(p.annotation) or p.name in _LISTENER_NAMES:
                        found.add((where, p.name))
    return found


def test_every_public_callable_parameter_is_checked_or_says_why_not() -> None:
    found = _callable_parameters()
    known = set(CHECKED) | CHECKED_ASYNC | set(EXEMPT)
    assert not found - known, f"a callable parameter nobody classified (add it to CHECKED or EXEMPT): {sorted(found - known)}"
    assert not known - found, f"classified but no longer found (renamed?): {sorted(known - found)}"
    assert len(found) > 30  # the walk found the package, not nothing


@pytest.mark.parametrize("kind", list(WRONG))
@pytest.mark.parametrize("where", sorted(CHECKED), ids=lambda w: f"{w[0].rsplit('.', 1)[-1]}.{w[1]}")
def test_a_callable_that_would_never_run_is_refused_in_one_line(where: tuple[str, str], kind: str) -> None:
    with pytest.raises(TypeError, match="plain function") as err:
        CHECKED[where](WRONG[kind])
    assert "\n" not in str(err.value) and where[1].split("_")[0] in str(err.value)


@pytest.mark.parametrize("where", sorted(CHECKED), ids=lambda w: f"{w[0].rsplit('.', 1)[-1]}.{w[1]}")
def test_a_plain_function_is_accepted(where: tuple[str, str]) -> None:
    if where == ("tracer.clients.consume.ConsumeLoop.run", "until"):
        stats = _on_loop(lambda loop: loop.run(until=lambda s: True))
        assert stats.received == 0
        return
    built = CHECKED[where](_plain)
    with _built(built):
        pass


@pytest.mark.parametrize("fn", [_plain, _gen_fn, _async_gen_fn], ids=["plain", "generator", "async-generator"])
def test_the_asyncio_engine_refuses_a_handler_that_is_not_async_def(fn: Any) -> None:
    with pytest.raises(TypeError, match="async def"):
        _async_dispatcher(fn, "handler")


def test_the_instrumentor_leaves_a_wrong_kind_listener_untraced_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """Instrumenting changes no behaviour (the stock client is built as it would be) but says, in
    one line, that the listener can never run."""
    from prometheus_client import CollectorRegistry

    from tracer.clients.instrumentor import RocketMQInstrumentor
    from tracer.clients.official import TracedListener

    inst = RocketMQInstrumentor()
    inst.instrument(registry=CollectorRegistry())
    try:
        listener = _listener(_async_fn)
        config = rmq.ClientConfiguration("127.0.0.1:1", rmq.Credentials())
        with caplog.at_level("ERROR", logger="tracer"):
            consumer = rmq.PushConsumer(config, "G", listener, {"T": rmq.FilterExpression()})
        plain = rmq.PushConsumer(config, "G", _listener(_plain), {"T": rmq.FilterExpression()})
    finally:
        inst.uninstrument()
    assert not isinstance(_find_listener(consumer), TracedListener)
    assert isinstance(_find_listener(plain), TracedListener)
    lines = [r.getMessage() for r in caplog.records if "plain function" in r.getMessage()]
    assert len(lines) == 1 and "left untraced" in lines[0] and "\n" not in lines[0], caplog.text


def _find_listener(consumer: Any) -> Any:
    found = [v for v in vars(consumer).values() if isinstance(v, rmq.MessageListener)]
    assert len(found) == 1, vars(consumer).keys()
    return found[0]


# --- a plain callable that RETURNS something that never ran (#30 item 1) ---------------------------
# The kind check above cannot see `lambda m: handle_async(m)`: the seams that run a user's callable
# once per message look at what it returned. Each seam here is found from CHECKED (and
# CHECKED_ASYNC), so a new per-message seam cannot be added without a runner below.
_PER_MESSAGE = ("handler", "message_listener", "listener", "callback")


class _Body:
    """Whether the returned object's body ever ran."""

    def __init__(self) -> None:
        self.ran = False


class _Awaitable:
    """Not a coroutine, but awaitable (a Future-like object)."""

    def __init__(self, body: _Body) -> None:
        self.body = body

    def __await__(self) -> Any:
        self.body.ran = True
        yield None


def _returning(kind: str, body: _Body) -> Callable[[Any], Any]:
    """A plain function (it passes the kind check) whose result is a ``kind`` that runs ``body``."""
    async def coro() -> None:
        body.ran = True

    def gen() -> Any:
        body.ran = True
        yield None

    async def agen() -> Any:
        body.ran = True
        yield None

    return {"coroutine": lambda m: coro(), "generator": lambda m: gen(), "async-generator": lambda m: agen(),
            "awaitable": lambda m: _Awaitable(body)}[kind]


def _named(error: BaseException | None) -> str | None:
    return None if error is None else f"{type(error).__name__}: {error}"


def _consumes(fn: Callable[[Any], Any]) -> Any:
    """A ``MessageListener`` whose ``consume(message)`` returns ``fn(message)``."""
    return type("Listener", (rmq.MessageListener,), {"consume": lambda self, m: fn(m)})()


def _run_dispatcher(fn: Callable[[Any], Any]) -> tuple[bool, str | None]:
    got: list[tuple[Any, BaseException | None]] = []
    d = Dispatcher(fn, workers=1, on_done=lambda item, o, e: got.append((o, e)))
    d.submit("m")
    assert d.close() is True
    ((outcome, error),) = got
    return outcome.value == "success", _named(error)


def _run_async_dispatcher(fn: Callable[[Any], Any]) -> tuple[bool, str | None]:
    got: list[tuple[Any, BaseException | None]] = []

    async def handler(m: Any) -> Any:  # an async def that returns what it should have awaited
        return fn(m)

    async def main() -> None:
        d = AsyncDispatcher(handler, workers=1, on_done=lambda item, o, e: got.append((o, e)))
        await d.submit("m")
        assert await d.close() is True
    asyncio.run(main())
    ((outcome, error),) = got
    return outcome.value == "success", _named(error)


def _run_loop(fn: Callable[[Any], Any]) -> tuple[bool, str | None]:
    from test_consume import pipeline, run_in_thread
    from waiting import wait_until

    _broker, loop = pipeline(1, fn, workers=1)
    t = run_in_thread(loop)
    try:
        wait_until(lambda: loop.statistics().failed >= 1, timeout=10, what="the first delivery failed")
    finally:
        loop.stop()
        t.join(10)
    s = loop.statistics()
    return s.acked > 0 or s.succeeded > 0, None


def _run_demand_push(fn: Callable[[Any], Any]) -> tuple[bool, str | None]:
    from test_demandpush import _consumer, _embedded
    from waiting import wait_until

    backend = _embedded()
    c = _consumer(backend, _consumes(fn))
    c.startup()
    try:
        backend.send("m")
        wait_until(lambda: c.statistics().failed >= 1, timeout=10, what="the first delivery failed")
    finally:
        c.shutdown()
        backend.close()
    return c.statistics().acked > 0, None


def _run_traced_listener(fn: Callable[[Any], Any]) -> tuple[bool, str | None]:
    from test_clients import FakeMessage

    from tracer.clients.official import TracedListener

    try:
        result = TracedListener(_consumes(fn), MessageTracer()).consume(FakeMessage())
    except Exception as exc:  # noqa: BLE001 - the client retries a message whose listener raised
        return False, _named(exc)
    return getattr(result, "name", None) == "SUCCESS", None


def _run_traced_callback(fn: Callable[[Any], Any]) -> tuple[bool, str | None]:
    import time

    from test_legacy_adapter import FakeMessage, FakeReceived

    try:
        result = traced_callback(fn, MessageTracer())(FakeReceived(FakeMessage("T"), "M1", time.time_ns() // 10**6))
    except Exception as exc:  # noqa: BLE001 - the 2.x client reconsumes a message whose callback raised
        return False, _named(exc)
    return result == 0, None


def _run_pipeline(fn: Callable[[Any], Any]) -> tuple[bool, str | None]:
    from tracer.testing import traced_pipeline

    with traced_pipeline(fn, workers=1) as pipe:
        pipe.send("m")
        (d,) = pipe.wait(1)
    return d.outcome == "success", f"{d.error_type}: {d.error_message}"


RETURNED = {
    ("tracer.dispatch.engine.Dispatcher", "handler"): _run_dispatcher,
    ("tracer.dispatch.aio.AsyncDispatcher", "handler"): _run_async_dispatcher,
    ("tracer.clients.consume.ConsumeLoop", "handler"): _run_loop,
    ("tracer.clients.demandpush.DemandPushConsumer", "message_listener"): _run_demand_push,
    ("tracer.clients.official.TracedListener", "listener"): _run_traced_listener,
    ("tracer.clients.legacy.traced_callback", "callback"): _run_traced_callback,
    ("tracer.testing.traced_pipeline", "handler"): _run_pipeline,
}


# the loops report a failed message only in their counters: no error object to look at
_COUNTED_ONLY = {("tracer.clients.consume.ConsumeLoop", "handler"),
                 ("tracer.clients.demandpush.DemandPushConsumer", "message_listener")}


def test_every_per_message_seam_is_checked_for_what_it_returns() -> None:
    seams = {w for w in set(CHECKED) | CHECKED_ASYNC if w[1] in _PER_MESSAGE}
    assert seams == set(RETURNED), f"a per-message seam without a runner: {sorted(seams ^ set(RETURNED))}"


@pytest.mark.parametrize("kind", ["coroutine", "generator", "async-generator", "awaitable"])
@pytest.mark.parametrize("where", sorted(RETURNED), ids=lambda w: f"{w[0].rsplit('.', 1)[-1]}.{w[1]}")
def test_a_returned_awaitable_or_generator_fails_the_message_unrun_and_unwarned(where: tuple[str, str],
                                                                                 kind: str) -> None:
    # fails before: the thread engine counted the returned coroutine a success (acked unrun) and
    # Python warned "coroutine ... was never awaited"; the push seams failed it without a reason
    import gc
    import warnings

    body = _Body()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        succeeded, error = RETURNED[where](_returning(kind, body))
        gc.collect()
    assert not succeeded, "a callable whose result never ran was counted a success (acked)"
    assert not body.ran
    if where not in _COUNTED_ONLY:  # the seam hands the error on; the loops count it (and nack)
        assert error is not None and error.startswith("HandlerNeverRan: ") and "AsyncDispatcher" in error, error
    unawaited = [str(w.message) for w in caught if "never awaited" in str(w.message)]
    assert not unawaited, unawaited


# --- what every user callable RETURNS or RAISES, once it runs (#30 findings 01, 06, 09, 10, 12) ---
# One rule for all of them: an answer that is junk (NaN, inf, 10**400, a wrong type, a coroutine
# or a generator it returned) takes the parameter's documented default; an Exception costs only
# the message it was called for; a BaseException (Ctrl-C) stops the loop cleanly with nothing
# held (run() re-raises it once the drain is done). A returned coroutine or generator is closed
# ("never awaited" is never warned). Each loop-facing parameter of CHECKED has a runner here; the
# rest say where their rule is tested (or why it is another rule).
_JUNK = {"raise": "raise", "nan": math.nan, "inf": math.inf, "huge": 10**400, "str": "2", "int": 5,
         "coroutine": "coroutine", "generator": "generator", "base": "base"}


def _answering(kind: str) -> Callable[..., Any]:
    """A plain function answering ``kind`` (raising for "raise" and "base")."""
    async def acheck(*a: Any) -> bool:  # pragma: no cover - closed unrun
        return False

    def gen(*a: Any) -> Any:  # pragma: no cover - closed unrun
        yield False

    def fn(*a: Any) -> Any:
        if kind == "raise":
            raise ValueError("the user's callable failed")
        if kind == "base":
            raise KeyboardInterrupt("Ctrl-C while the user's callable ran")
        if kind == "coroutine":
            return acheck(*a)
        if kind == "generator":
            return gen(*a)
        return _JUNK[kind]
    return fn


def _loop_of(n: int, handler: Callable[[Any], Any], **kw: Any) -> ConsumeLoop:
    from test_consume import pipeline

    _broker, loop = pipeline(n, handler, workers=2, invisible=5.0, **kw)
    return loop


def _settled(s: Any) -> bool:
    return s.reported >= 1 and s.held == 0


def _run_loop_until(loop: ConsumeLoop, until: Callable[[Any], bool], base: bool) -> Any:
    if base:
        with pytest.raises(KeyboardInterrupt):
            loop.run(until=until)
    else:
        loop.run(until=until)
    s = loop.statistics()
    # nothing held, and every delivery is accounted for, whatever the callable did
    assert s.held == 0 and s.received == s.acked + s.retry_scheduled + s.given_back + s.ack_errors + s.expired, s
    return s


def _loop_key(kind: str) -> None:
    # fails before (finding 06): a message whose key= failed counted failed and retry_scheduled
    ran: list[Any] = []
    loop = _loop_of(2, ran.append, key=_answering(kind), retry_backoff=lambda a: 30)
    s = _run_loop_until(loop, lambda s: s.reported >= 2 or s.held == 0 and s.received > 0, kind == "base")
    assert not ran and s.failed == 0 and s.retry_scheduled == 0 and loop.dispatcher.statistics().failed == 0, s
    assert s.not_started == s.given_back == s.received > 0, s


def _loop_cost(kind: str) -> None:
    ran: list[Any] = []
    loop = _loop_of(2, ran.append, cost=_answering(kind), policy="cost_aware")
    s = _run_loop_until(loop, lambda s: s.acked >= 2 or s.held == 0 and s.received > 0, kind == "base")
    if kind != "base":  # a junk cost is cost 0: the message runs
        assert len(ran) == 2 and s.acked == 2 and s.failed == 0, s


def _failing(m: Any) -> None:
    raise RuntimeError("the handler failed")


def _loop_backoff(kind: str) -> None:
    # fails before (findings 01, 09): a raising retry_backoff= ended run() with its ValueError; a
    # junk answer failed the nack (an ack error: the message waited out its whole lease)
    loop = _loop_of(1, _failing, retry_backoff=_answering(kind))
    s = _run_loop_until(loop, _settled, kind == "base")
    assert s.failed == 1 and s.retry_scheduled == 1 and s.ack_errors == 0, s


def _loop_predicate(kind: str, where: str) -> None:
    # fails before (finding 12): a returned coroutine or generator was taken as True
    loop = _loop_of(1, lambda m: None)
    fn = _answering(kind)
    expected = {"raise": ValueError, "base": KeyboardInterrupt}.get(kind, TypeError)
    try:
        if where == "until":
            with pytest.raises(expected):  # the caller's own callable, on the caller's thread
                loop.run(until=fn)
        else:
            import threading

            t = threading.Thread(target=loop.run, daemon=True)
            t.start()
            with pytest.raises(expected):
                loop.wait(fn, timeout=math.inf)
            loop.stop()
            t.join(30)
            assert not t.is_alive()
    finally:
        loop.dispatcher.close()
    assert loop.statistics().held == 0


def _one_submit(engine: str, handler: Any, *, interrupted: bool = False, **kw: Any) -> Any:
    """Submit one message to a one-worker dispatcher of ``engine`` (built with ``kw``) and close it;
    its statistics. ``interrupted``: the submit must raise KeyboardInterrupt (a user callable's)."""
    if engine == "thread":
        d = Dispatcher(handler, workers=1, **kw)
        if interrupted:
            with pytest.raises(KeyboardInterrupt):
                d.submit("m")
        else:
            assert d.submit("m") is True
        assert d.close() is True
        return d.statistics()

    async def run_async(m: Any) -> None:
        handler(m)

    async def main() -> Any:
        d = AsyncDispatcher(run_async, workers=1, **kw)
        if interrupted:
            with pytest.raises(KeyboardInterrupt):
                await d.submit("m")
        else:
            assert await d.submit("m") is True
        assert await d.close() is True
        return d.statistics()
    return asyncio.run(main())


def _dispatcher_key(kind: str, engine: str) -> None:
    # fails before (finding 06, both engines): a failed key= was Outcome.FAILURE, counted failed
    got: list[tuple[Any, Any]] = []
    ran: list[Any] = []
    stats = _one_submit(engine, ran.append, interrupted=kind == "base", key=_answering(kind),
                        on_done=lambda i, o, e: got.append((o, e)))
    assert not ran and stats.failed == 0
    if kind != "base":
        assert [o.value for o, _ in got] == ["not_started"] and stats.not_started == 1, got


def _dispatcher_cost(kind: str, engine: str) -> None:
    got: list[Any] = []
    stats = _one_submit(engine, lambda m: None, interrupted=kind == "base", cost=_answering(kind),
                        on_done=lambda i, o, e: got.append(o))
    if kind != "base":  # a cost is a hint: a junk one is 0 and the message runs
        assert [o.value for o in got] == ["success"] and stats.cost_errors == 1, (got, stats)


def _dispatcher_on_done(kind: str, engine: str) -> None:
    # its answer is ignored and its Exception logged: the message's outcome stands (fails before
    # for a returned coroutine: "never awaited")
    seen: list[Any] = []

    def on_done(item: Any, outcome: Any, error: Any) -> Any:
        seen.append(outcome)
        return _answering(kind)()

    stats = _one_submit(engine, lambda m: None, on_done=on_done)
    assert [o.value for o in seen] == ["success"] and stats.handled == 1 and stats.failed == 0, stats


def _cost_table_group(kind: str, how: str) -> None:
    # a grouping is applied while the table is built: anything but a str is a loud CostTableError
    # there (fails before for a returned coroutine or an int: accepted, a coroutine never matched)
    from tracer.dispatch.costtable import CostTable, CostTableError

    fn = _answering(kind)
    expected: type[BaseException] = KeyboardInterrupt if kind == "base" else (
        ValueError if kind == "raise" else CostTableError)
    with pytest.raises(expected):
        CostTable({"a/1": 1.0}, fn) if how == "init" else CostTable({"a/1": 1.0}).with_group(fn)


def _job_costs(kind: str) -> None:
    # a one-shot job: a junk cost is a loud CostTableError naming the message, before anything is
    # sent (fails before for a returned coroutine: "never awaited")
    from tracer.dispatch.cost import job_costs
    from tracer.dispatch.costtable import CostTableError

    expected: type[BaseException] = KeyboardInterrupt if kind == "base" else CostTableError
    with pytest.raises(expected):
        job_costs(["m"], _answering(kind))


def _demand_push_backoff(kind: str) -> None:
    # fails before (finding 10): a raising retry_backoff= ended the loop while `running` stayed True
    from test_demandpush import Listener, _embedded
    from waiting import wait_until

    from tracer.clients.demandpush import DemandPushConsumer

    backend = _embedded()
    listener = Listener({("first", 1): lambda: rmq.ConsumeResult.FAILURE})
    c = DemandPushConsumer(backend.configuration, backend.group, listener, {backend.topic: rmq.FilterExpression()},
                           consumption_thread_count=2, invisible_duration=10, retry_backoff=_answering(kind),
                           shutdown_timeout=10)
    c.startup()
    try:
        backend.send("first")
        wait_until(lambda: c.statistics().retry_scheduled + c.statistics().given_back >= 1 or not c.running,
                   timeout=30, what="the failed message given back")
        if kind == "base":  # the loop stopped cleanly: it says so, and holds nothing
            wait_until(lambda: not c.running, timeout=30, what="running turns False")
            assert isinstance(c.error, KeyboardInterrupt) and c.statistics().held == 0
            return
        backend.send("later")
        wait_until(lambda: any(b == "later" for b, _m, _a in listener.calls), timeout=30, what="a later message runs")
        assert c.running and c.error is None and c.statistics().ack_errors == 0
    finally:
        c.shutdown()
        backend.close()


_LOOP_KINDS = ["raise", "base", "coroutine", "generator"]
RESULT_RUNNERS: dict[tuple[str, str], tuple[list[str], Callable[[str], None]]] = {
    ("tracer.clients.consume_options.DispatchOptions", "key"): ([*_LOOP_KINDS, "int"], _loop_key),
    ("tracer.clients.consume_options.DispatchOptions", "cost"): ([*_LOOP_KINDS, "nan", "inf", "huge", "str"], _loop_cost),
    ("tracer.clients.consume_options.FlowOptions", "retry_backoff"):
        ([*_LOOP_KINDS, "nan", "inf", "huge", "str"], _loop_backoff),
    ("tracer.clients.demandpush.DemandPushConsumer", "retry_backoff"): (["raise", "base", "coroutine", "nan"],
                                                                        _demand_push_backoff),
    ("tracer.clients.consume.ConsumeLoop.run", "until"): (_LOOP_KINDS, lambda k: _loop_predicate(k, "until")),
    ("tracer.clients.consume.ConsumeLoop.wait", "predicate"): (_LOOP_KINDS, lambda k: _loop_predicate(k, "wait")),
    ("tracer.dispatch.engine.Dispatcher", "key"): ([*_LOOP_KINDS, "int"], lambda k: _dispatcher_key(k, "thread")),
    ("tracer.dispatch.aio.AsyncDispatcher", "key"): ([*_LOOP_KINDS, "int"], lambda k: _dispatcher_key(k, "asyncio")),
    ("tracer.dispatch.engine.Dispatcher", "cost"): ([*_LOOP_KINDS, "nan", "huge", "str"],
                                                    lambda k: _dispatcher_cost(k, "thread")),
    ("tracer.dispatch.aio.AsyncDispatcher", "cost"): ([*_LOOP_KINDS, "nan", "huge", "str"],
                                                      lambda k: _dispatcher_cost(k, "asyncio")),
    ("tracer.dispatch.costtable.CostTable", "group"): (["raise", "base", "coroutine", "generator", "int"],
                                                        lambda k: _cost_table_group(k, "init")),
    ("tracer.dispatch.costtable.CostTable.with_group", "group"): (["raise", "coroutine", "int"],
                                                                   lambda k: _cost_table_group(k, "with")),
    ("tracer.dispatch.cost.job_costs", "cost"): (["raise", "base", "coroutine", "nan", "huge", "str"], _job_costs),
    # on a worker even a BaseException from on_done is swallowed (a worker never dies: core.py)
    ("tracer.dispatch.engine.Dispatcher", "on_done"): (["raise", "base", "coroutine", "generator", "nan"],
                                                       lambda k: _dispatcher_on_done(k, "thread")),
    ("tracer.dispatch.aio.AsyncDispatcher", "on_done"): (["raise", "base", "coroutine", "generator", "nan"],
                                                         lambda k: _dispatcher_on_done(k, "asyncio")),
}

# Their result is another rule, tested where it lives (each reason names it).
RESULTS_ELSEWHERE = {
    ("tracer.telemetry.tracer.MessageTracer", "listeners"): "its answer is ignored (a returned coroutine is "
        "closed: test_a_finish_listener_returning_a_coroutine_is_closed); an Exception is a hook failure",
    ("tracer.telemetry.tracercore.TracerCore", "listeners"): "MessageTracer's (its constructor is this one)",
    ("tracer.telemetry.exportchild.ChildExportProcessor", "drops"): "a counter hook: its answer is ignored; an "
        "Exception costs only its count, logged once (test_a_drops_hook_that_raises_costs_only_its_own_count)",
    ("tracer.clients.producer.TracedProducer.send_job", "cost"): "a one-shot job: a junk cost is a loud "
        "CostTableError before anything is sent (test_cost_table)",
    ("tracer.clients.producer.TracedProducer.send_job", "key"): "as send_job's cost",
    ("tracer.clients.legacy.TracedLegacyProducer.send_job", "cost"): "as TracedProducer.send_job",
    ("tracer.clients.legacy.TracedLegacyProducer.send_job", "key"): "as TracedProducer.send_job",
    ("tracer.clients.producer.ordered_job", "cost"): "as TracedProducer.send_job",
    ("tracer.clients.producer.ordered_job", "key"): "as TracedProducer.send_job",
    ("tracer.dispatch.cost.job_costs", "key"): "as job_costs' cost",
    ("tracer.dispatch.cost.table_cost", "key"): "as job_costs' cost",
    ("tracer.dispatch.costtable.learn_costs", "group"): "builds a CostTable: as CostTable's group",
    ("tracer.dispatch.costtable.load_costs", "group"): "builds a CostTable: as CostTable's group",
    ("tracer.dispatch.costtable.parse_costs", "group"): "builds a CostTable: as CostTable's group",
    ("tracer.clients.ahead.ReceiveAhead", "cost"): "a raising, coroutine or junk answer counts as an "
        "unknown cost (test_receive_ahead: test_an_unknown_raising_or_junk_cost_never_counts)",
}


def test_every_callable_parameter_has_a_rule_for_what_it_answers() -> None:
    """A new callable parameter cannot be added without a runner (or a reason) for its results."""
    answered = {w for w in CHECKED if w[1] not in _PER_MESSAGE}
    known = set(RESULT_RUNNERS) | set(RESULTS_ELSEWHERE)
    assert answered == known, f"unclassified: {sorted(answered - known)}; gone: {sorted(known - answered)}"


@pytest.mark.parametrize(("where", "kind"), [(w, k) for w in sorted(RESULT_RUNNERS) for k in RESULT_RUNNERS[w][0]],
                         ids=lambda x: x if isinstance(x, str) else f"{x[0].rsplit('.', 1)[-1]}.{x[1]}")
def test_a_user_callable_answering_junk_or_raising_is_contained(where: tuple[str, str], kind: str) -> None:
    import gc
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        RESULT_RUNNERS[where][1](kind)
        gc.collect()
    unawaited = [str(w.message) for w in caught if "never awaited" in str(w.message)]
    assert not unawaited, unawaited


def test_a_finish_listener_returning_a_coroutine_is_closed() -> None:
    import gc
    import warnings

    async def later(trace: Any, outcome: Any) -> None:  # pragma: no cover - closed unrun
        return None

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _run_pipeline_with(MessageTracer(listeners=[lambda t, o: later(t, o)]))
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)]


def _run_pipeline_with(tracer: MessageTracer) -> None:
    from test_consume import pipeline

    _broker, loop = pipeline(1, lambda m: None, tracer=tracer, workers=1)
    s = loop.run(until=lambda s: s.acked >= 1)
    assert s.acked == 1
