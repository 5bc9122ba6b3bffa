"""Every public numeric parameter, at 0, -1, NaN, inf and 10**400: it works or fails loudly at once.

Issue #30: ``stop(timeout=math.inf)`` raised ``OverflowError`` deep in shutdown, a cost of 10**400
raised out of ``submit``. This census walks the public signatures (``tracer.__all__``, each
sub-package's ``__all__``, and the modules of the consume loop, the embedded broker and the
config), finds every parameter annotated ``int`` or ``float`` (optionally ``| None``), and calls
each with the five values. Each call must return, or raise ``ValueError`` / ``TypeError``, within
a bound — never hang, never ``OverflowError`` or anything else, and never accept a NaN silently
(a NaN count or number of seconds cannot work). A new numeric parameter fails the census until it
is added to ``CHECKED`` (with a builder) or to ``EXEMPT`` (with the reason). Known failures are
listed in ``KNOWN`` with the issue item: strict xfails, so a fix flips them.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import math
import pkgutil
import re
import threading
from collections.abc import Callable
from typing import Any

import pytest

import tracer
from tracer import AsyncDispatcher, ConsumeLoop, Dispatcher, ManualClock, MessageTracer
from tracer.clients.consume_options import (
    DispatchOptions,
    FlowOptions,
    LeaseOptions,
    exponential_backoff,
    whole_seconds,
)
from tracer.dispatch import Aggressive, CostAware, DispatchMetrics, Random, RoundRobin
from tracer.embedded import EmbeddedBroker, SimpleConsumer

VALUES: dict[str, object] = {"zero": 0, "negative": -1, "nan": math.nan, "inf": math.inf, "huge": 10**400}
MODULES = ("tracer.clients.consume", "tracer.clients.consume_options", "tracer.clients.demandpush",
           "tracer.clients.official", "tracer.clients.probe", "tracer.embedded", "tracer.config")
# frozen snapshots and records the library builds and hands out: nobody passes them limits
RECORDS = ("ConsumeStats", "ConsumeState", "DispatchStats", "HandlerTimeout", "MessageInfo", "EmbeddedBrokerError",
           "Settings", "ReceivedStats", "SpanQueueStats")
HANG_S = 5.0  # far beyond any call here (they return in milliseconds): a call still running is a hang


def _numeric_parameters() -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    names = ["tracer", *(f"tracer.{i.name}" for i in pkgutil.iter_modules(tracer.__path__) if i.ispkg), *MODULES]
    for mn in names:
        module = importlib.import_module(mn)
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name, None)
            if inspect.isclass(obj):
                if obj.__name__ in RECORDS:
                    continue
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
                    # int | float: a count the compiled build (tracer.compiled) must hand over
                    # unconverted, so that its own check refuses a bool or a float
                    if re.fullmatch(r"(int|float)( \| (int|float))?( \| None)?", str(p.annotation)):
                        found.add((where, p.name))
    return found


def _consumer() -> SimpleConsumer:
    broker = EmbeddedBroker(min_receive_invisible=1)
    broker.create_topic("T")
    consumer = SimpleConsumer(broker, "G", {"T": None}, await_duration=0)
    consumer.startup()
    return consumer


def _loop_kw(name: str) -> Callable[[object], object]:
    def build(v: object) -> object:
        loop = ConsumeLoop(_consumer(), lambda m: None, **{name: v})  # type: ignore[misc]
        loop.dispatcher.close()
        return loop
    return build


def _stop(polled: bool) -> Callable[[object], object]:
    def call(v: object) -> object:
        loop = ConsumeLoop(_consumer(), lambda m: None, invisible_duration=1)
        try:
            if polled:
                loop.poll()
            return loop.stop(timeout=v)  # type: ignore[arg-type]
        finally:
            loop.stop(timeout=0)
            loop.dispatcher.close(timeout=1)
    return call


def _wait(v: object) -> object:
    # a wait without a bound (None, inf, huge) on a predicate that never holds lasts until the loop
    # ends: the loop is stopped meanwhile, so "works" is a wait that then returns
    loop = ConsumeLoop(_consumer(), lambda m: None)
    ender = threading.Timer(0.2, loop.stop)
    ender.start()
    try:
        return loop.wait(lambda s: False, timeout=v)  # type: ignore[arg-type]
    finally:
        ender.cancel()
        loop.dispatcher.close()


def _dispatcher(**kw: object) -> object:
    d = Dispatcher(lambda m: None, **kw)  # type: ignore[arg-type]
    d.close(timeout=1)
    return d


def _dispatcher_call(method: str) -> Callable[[object], object]:
    def call(v: object) -> object:
        d = Dispatcher(lambda m: None, workers=1)
        try:
            if method == "submit":
                return d.submit("x", timeout=v)  # type: ignore[arg-type]
            if method == "close":
                return d.close(timeout=v)  # type: ignore[arg-type]
            return getattr(d, method)(timeout=v)
        finally:
            d.close(timeout=1)
    return call


async def _async_noop(m: object) -> None:
    return None


def _async(kw: dict[str, object] | None = None, method: str | None = None) -> Callable[[object], object]:
    def call(v: object) -> object:
        async def body() -> object:
            d = AsyncDispatcher(_async_noop, **({k: v for k in (kw or {})}))  # type: ignore[arg-type]
            try:
                if method == "submit":
                    return await d.submit("x", timeout=v)  # type: ignore[arg-type]
                if method == "close":
                    return await d.close(timeout=v)  # type: ignore[arg-type]
                if method is not None:
                    return await getattr(d, method)(timeout=v)
                return d
            finally:
                await d.close(timeout=1)
        return asyncio.run(body())
    return call


def _demand_push(name: str) -> Callable[[object], object]:
    def build(v: object) -> object:
        rmq = pytest.importorskip("rocketmq")
        from tracer.clients.demandpush import DemandPushConsumer

        listener = type("L", (rmq.MessageListener,), {"consume": lambda self, m: rmq.ConsumeResult.SUCCESS})()
        return DemandPushConsumer(rmq.ClientConfiguration("127.0.0.1:1", rmq.Credentials()), "G", listener,
                                  {"T": rmq.FilterExpression()}, **{name: v})
    return build


def _broker(name: str) -> Callable[[object], object]:
    def build(v: object) -> object:
        kw: dict[str, object] = {name: v}
        if name == "min_receive_invisible":
            kw["max_invisible"] = 43200
        return EmbeddedBroker(**kw)  # type: ignore[arg-type]
    return build


def _options(cls: Any, name: str) -> Callable[[object], object]:
    return lambda v: cls(**{name: v})


CHECKED: dict[tuple[str, str], Callable[[object], object]] = {
    **{("tracer.clients.consume_options.DispatchOptions", n): _options(DispatchOptions, n)
       for n in ("workers", "handler_timeout")},
    **{("tracer.clients.consume_options.LeaseOptions", n): _options(LeaseOptions, n)
       for n in ("invisible_duration", "renew_margin", "hang_grace", "renew_threads")},
    **{("tracer.clients.consume_options.FlowOptions", n): _options(FlowOptions, n)
       for n in ("max_batch", "prefetch", "resync_after", "ack_threads", "stop_timeout")},
    # a loop nobody runs: stop() closes it and answers at once (a polled, never-run loop would
    # wait for a run() that never comes; the fault harness stops running loops)
    ("tracer.clients.consume.ConsumeLoop.stop", "timeout"): _stop(polled=False),
    ("tracer.clients.consume.ConsumeLoop.wait", "timeout"): _wait,
    ("tracer.clients.consume_options.exponential_backoff", "attempt"): lambda v: exponential_backoff(v),  # type: ignore[arg-type]
    ("tracer.clients.consume_options.exponential_backoff", "base"): lambda v: exponential_backoff(3, base=v),  # type: ignore[arg-type]
    ("tracer.clients.consume_options.exponential_backoff", "cap"): lambda v: exponential_backoff(3, cap=v),  # type: ignore[arg-type]
    ("tracer.clients.consume_options.whole_seconds", "seconds"): lambda v: whole_seconds(v),  # type: ignore[arg-type]
    ("tracer.dispatch.engine.Dispatcher", "workers"): lambda v: _dispatcher(workers=v),
    ("tracer.dispatch.engine.Dispatcher", "handler_timeout"): lambda v: _dispatcher(handler_timeout=v),
    **{("tracer.dispatch.engine.Dispatcher." + m, "timeout"): _dispatcher_call(m)
       for m in ("submit", "close", "wait_for_free_slot", "wait_idle")},
    ("tracer.dispatch.aio.AsyncDispatcher", "workers"): _async({"workers": 0}),
    ("tracer.dispatch.aio.AsyncDispatcher", "handler_timeout"): _async({"handler_timeout": 0}),
    **{("tracer.dispatch.aio.AsyncDispatcher." + m, "timeout"): _async(method=m)
       for m in ("submit", "close", "wait_for_free_slot", "wait_idle")},
    ("tracer.dispatch.policy.Aggressive", "max_parked"): lambda v: Aggressive(max_parked=v),  # type: ignore[arg-type]
    ("tracer.dispatch.policy.CostAware", "window"): lambda v: CostAware(window=v),  # type: ignore[arg-type]
    ("tracer.dispatch.policy.RoundRobin", "buffer"): lambda v: RoundRobin(buffer=v),  # type: ignore[arg-type]
    ("tracer.dispatch.policy.Random", "buffer"): lambda v: Random(buffer=v),  # type: ignore[arg-type]
    ("tracer.dispatch.policy.Random", "seed"): lambda v: Random(seed=v).scheduler(2),  # type: ignore[arg-type]
    ("tracer.dispatch.metrics.DispatchMetrics", "refresh_interval"):
        lambda v: DispatchMetrics(registry=__import__("prometheus_client").CollectorRegistry(), refresh_interval=v),  # type: ignore[arg-type]
    **{("tracer.clients.demandpush.DemandPushConsumer", n): _demand_push(n)
       for n in ("consumption_thread_count", "handler_timeout", "invisible_duration", "max_cache_message_count",
                 "max_cache_message_size", "shutdown_timeout", "startup_timeout")},
    ("tracer.embedded.EmbeddedBroker", "min_receive_invisible"): _broker("min_receive_invisible"),
    ("tracer.embedded.EmbeddedBroker", "max_invisible"): _broker("max_invisible"),
    ("tracer.embedded.EmbeddedBroker.create_topic", "queues"):
        lambda v: EmbeddedBroker().create_topic("F", fifo=True, queues=v),  # type: ignore[arg-type]
    ("tracer.path.clock.ManualClock.advance_s", "seconds"): lambda v: ManualClock().advance_s(v),  # type: ignore[arg-type]
    ("tracer.telemetry.tracer.MessageTracer", "capture_body"): lambda v: MessageTracer(capture_body=v),  # type: ignore[arg-type]
    ("tracer.clients.producer.TracedProducer.send_job", "priority_levels"):
        lambda v: __import__("test_numeric_bounds").priority_job(v),
    ("tracer.dispatch.cost.job_priorities", "levels"):
        lambda v: __import__("tracer.dispatch.cost", fromlist=["x"]).job_priorities([1.0], v),  # type: ignore[arg-type]
}

EXEMPT: dict[tuple[str, str], str] = {
    **{(w, "workers"): "a Policy's scheduler is built by the dispatcher from its own checked workers"
       for w in ("tracer.dispatch.policy.Policy.scheduler", "tracer.dispatch.policy.Aggressive.scheduler",
                 "tracer.dispatch.policy.CostAware.scheduler", "tracer.dispatch.policy.RoundRobin.scheduler",
                 "tracer.dispatch.policy.Random.scheduler")},
    ("tracer.clients.consume_options.FlowOptions.retry_backoff", "attempt"): "the default retry_backoff is "
        "exponential_backoff, checked under its own name",
    ("tracer.clients.consume_options.FlowOptions.retry_backoff", "base"): "as above",
    ("tracer.clients.consume_options.FlowOptions.retry_backoff", "cap"): "as above",
    ("tracer.embedded.EmbeddedBroker.change_invisible", "invisible_duration"): "the broker's own limits, asked of "
        "the real proxy by tests/test_broker_rules_real.py (both sides refuse floats and out-of-range values)",
    ("tracer.embedded.EmbeddedBroker.receive", "invisible_duration"): "as above",
    ("tracer.embedded.EmbeddedBroker.receive", "max_num"): "as the proxy: the client's batch size",
    ("tracer.embedded.EmbeddedBroker.receive", "await_s"): "a test double's long-poll wait",
    ("tracer.embedded.SimpleConsumer", "await_duration"): "a test double's long-poll wait",
    ("tracer.embedded.SimpleConsumer.change_invisible_duration", "invisible_duration"): "the broker's rule (above)",
    ("tracer.embedded.SimpleConsumer.receive", "invisible_duration"): "the broker's rule (above)",
    ("tracer.embedded.SimpleConsumer.receive", "max_message_num"): "the broker's rule (above)",
    ("tracer.clients.official.TracedSimpleConsumer.receive", "max_message_num"): "passed to the 5.x client unchanged",
    ("tracer.clients.official.TracedSimpleConsumer.receive_async", "max_message_num"): "passed to the 5.x client unchanged",
    ("tracer.clients.official.ReceivedTraces", "max_age_s"): "internal bound of the wrapper's trace table",
    ("tracer.clients.official.ReceivedTraces", "max_traces"): "internal bound of the wrapper's trace table",
    ("tracer.clients.probe.ProbeSender", "interval"): "the CLI's probe interval (argparse checks it: whole_at_least)",
    ("tracer.clients.probe.ProbeSender.run", "count"): "the CLI's probe count",
    ("tracer.clients.producer.TracedProducer.send", "cost"): "a value stamped on the message, not a limit: hostile "
        "costs are counted on the consumer (tests/test_reliability_input.py: cost_invalid)",
    ("tracer.clients.producer.TracedProducer.send_async", "cost"): "as above",
    ("tracer.telemetry.tracer.MessageTracer.start_send", "cost"): "as above",
    ("tracer.telemetry.tracer.MessageTracer.start_send", "body_size"): "a fact about the message, recorded",
    ("tracer.telemetry.tracer.MessageTracer.start_send", "delivery_ms"): "a fact about the message, recorded",
    ("tracer.telemetry.tracer.MessageTracer", "server_port"): "an attribute value, recorded",
    ("tracer.config.CountingExporter.force_flush", "timeout_millis"): "the OpenTelemetry SDK's protocol",
    ("tracer.config.CountingSpanProcessor.force_flush", "timeout_millis"): "the OpenTelemetry SDK's protocol",
    ("tracer.config.CountingSpanProcessor", "max_queue_size"): "read from OTEL_BSP_MAX_QUEUE_SIZE by Settings",
    ("tracer.path.clock.ManualClock", "start_ns"): "a test clock's start",
    ("tracer.path.clock.ManualClock.advance", "ns"): "a test clock's step in int ns",
    ("tracer.path.clock.ManualClock.step_wall", "ns"): "a test clock's step in int ns",
    ("tracer.telemetry.metrics.TracerMetrics", "label_limit"): "internal bound (BoundedLabel)",
    ("tracer.telemetry.metrics.TracerMetrics.avoidable", "seconds"): "a measurement the dispatcher reports",
    ("tracer.telemetry.metrics.TracerMetrics.observe", "trace_id"): "an exemplar's trace id",
    ("tracer.telemetry.tracer.MessageTrace.handler_scope", "start_ns"): "a stamp (clock reading), not a limit",
    ("tracer.telemetry.tracer.MessageTrace.mark", "ns"): "a stamp (clock reading), not a limit",
    ("tracer.telemetry.tracer.MessageTracer.start_span_at", "start_ns"): "a stamp (clock reading), not a limit",
    ("tracer.telemetry.sendtrace.SendTrace", "produce_ns"): "a stamp (clock reading), not a limit",
}

# (where, parameter, value) -> why it fails today. Strict xfails: a fix flips them.
# the adversarial review's scripts (tests/adversarial/, run by tests/test_adversarial.py) for the same class
_ADV = "tests/adversarial/{}: "
_HUGE = "new (census): 10**400 raises OverflowError, not ValueError (math.isfinite, float(), C ssize_t)"
_INF = "new (census): inf raises OverflowError, not ValueError"
_NAN = "new (census): NaN accepted without an error (a NaN count or duration cannot work)"
KNOWN: dict[tuple[str, str, str], str] = {
}


def _call(fn: Callable[[object], object], v: object) -> tuple[str, BaseException | None]:
    """'ok' | 'raised' | 'hang', in a daemon thread so a hang is reported, not waited for."""
    out: list[tuple[str, BaseException | None]] = []

    def run() -> None:
        try:
            fn(v)
            out.append(("ok", None))
        except BaseException as exc:  # noqa: BLE001 - classified below
            out.append(("raised", exc))

    t = threading.Thread(target=run, daemon=True, name="numeric-census")
    t.start()
    t.join(HANG_S)
    return out[0] if out else ("hang", None)


def test_every_public_numeric_parameter_is_checked_or_says_why_not() -> None:
    found = _numeric_parameters()
    known = set(CHECKED) | set(EXEMPT)
    assert not found - known, f"a numeric parameter nobody classified (add it to CHECKED or EXEMPT): {sorted(found - known)}"
    assert not known - found, f"classified but no longer found (renamed?): {sorted(known - found)}"
    assert len(found) > 60


def _cases() -> list[Any]:
    cases = []
    for where in sorted(CHECKED):
        for name in VALUES:
            marks = []
            why = KNOWN.get((*where, name))
            if why is not None:
                marks.append(pytest.mark.xfail(strict=True, reason=why))
            cases.append(pytest.param(where, name, marks=marks,
                                      id=f"{'.'.join(where[0].split('.')[-2:])}.{where[1]}={name}"))
    return cases


@pytest.mark.parametrize(("where", "value"), _cases())
def test_a_numeric_parameter_works_or_fails_loudly_at_once(where: tuple[str, str], value: str) -> None:
    verdict, exc = _call(CHECKED[where], VALUES[value])
    named = "invariant works_or_fails_loudly:"  # the census's promise, as the fault table names it
    assert verdict != "hang", f"{named} {where} = {value}: still running after {HANG_S:g} s"
    if verdict == "raised":
        assert isinstance(exc, (ValueError, TypeError)), (
            f"{named} {where} = {value}: raised {exc!r}, not ValueError/TypeError")
        assert "\n" not in str(exc).strip(), f"{named} {where} = {value}: a one-line error, got {exc!s}"
    else:
        assert value != "nan", f"{named} {where} = NaN was accepted silently"
