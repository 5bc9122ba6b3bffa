"""Issue 31 item 9: a timed-out handler's span is ended when the handler is let go.

A handler reported ``TIMEOUT`` while it still runs keeps its ``handler`` span open for its late
return (the user's spans nest under it). Before, when that return never came before a
dispatcher's ``close``/``stop(timeout=)`` or the provider's shutdown, the span was never
exported and the user's span under it was an orphan. Now it ends then, status ERROR,
``rmqtrace.abandoned``. Both dispatcher engines and the provider shutdown; ConsumeLoop's
``stop(timeout=)`` (and DemandPushConsumer, which stops through it) ride the thread engine's close.

Gap (a) of the issue's last round: a handler still *running* (no timeout reported: none set, or
not yet past it) at the provider's shutdown or after a bounded stop, on every class that runs a
handler — found by a census, so a new engine or seam joins the parametrized tests.
"""

from __future__ import annotations

import asyncio
import threading
import time
from enum import IntEnum
from typing import Any

import pytest
from embedded_rig import consumer_with_messages
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from waiting import wait_until

from tracer.dispatch import AsyncDispatcher, Dispatcher
from tracer.path import names as n
from tracer.path.clock import ManualClock
from tracer.path.message import MessageInfo
from tracer.telemetry.tracer import MessageTracer


class Rig:
    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = MessageTracer(consumer_group="G", tracer_provider=self.provider)
        self.user = trace.get_tracer("user", tracer_provider=self.provider)

    def message(self, mid: str = "m1") -> Any:
        return self.tracer.start_message(MessageInfo("T", message_id=mid))

    def user_span(self) -> None:
        with self.user.start_as_current_span("user-work"):
            pass

    def check(self) -> None:
        spans = {s.name: s for s in self.exporter.get_finished_spans()}
        user = spans["user-work"]
        assert "handler" in spans, "the timed-out handler's span was never ended: the user's span is an orphan"
        handler = spans["handler"]
        assert user.parent is not None and user.parent.span_id == handler.context.span_id
        assert handler.status.status_code is StatusCode.ERROR
        assert handler.attributes.get(n.ABANDONED) is True
        assert handler.attributes.get(n.ERROR_TYPE)


@pytest.mark.parametrize("let_go", ["close", "provider_shutdown"])
def test_item9_thread_engine_ends_a_hung_handlers_span(let_go):
    rig = Rig()
    clock = ManualClock()
    release = threading.Event()
    started = threading.Event()

    def handler(item: int) -> None:
        rig.user_span()
        started.set()
        release.wait(10)

    d = Dispatcher(handler, workers=1, handler_timeout=1.0, clock=clock)
    try:
        d.submit(1, rig.message())
        assert started.wait(5)
        clock.advance_s(2.0)
        assert d.check_timeouts() == 1
        if let_go == "close":
            d.close(timeout=0)
        else:
            rig.provider.shutdown()
        rig.check()
        release.set()  # its late return ends nothing more
        wait_until(lambda: d.statistics().overrun == 0, what="the hung thread returns")
        assert [s.name for s in rig.exporter.get_finished_spans()].count("handler") == 1
    finally:
        release.set()
        d.close(timeout=5)


def test_item9_async_engine_ends_a_hung_handlers_span_at_close():
    rig = Rig()
    release = threading.Event()

    async def main() -> None:
        async def handler(item: int) -> None:
            rig.user_span()
            while not release.is_set():  # ignores its cancellation: it overruns
                try:
                    await asyncio.sleep(0.01)
                except asyncio.CancelledError:
                    continue

        d: AsyncDispatcher[int] = AsyncDispatcher(handler, workers=1, handler_timeout=0.05)
        try:
            await d.submit(1, rig.message())
            for _ in range(500):
                if d.statistics().timed_out:
                    break
                await asyncio.sleep(0.01)
            assert d.statistics().timed_out == 1
            await d.close(timeout=0)
            rig.check()
        finally:
            release.set()  # the overrun task ends (before the loop closes)
            await asyncio.sleep(0.05)

    try:
        asyncio.run(main())
    finally:
        release.set()
    assert [s.name for s in rig.exporter.get_finished_spans()].count("handler") == 1


def test_item9_consume_loop_stop_with_timeout_ends_a_hung_handlers_span():
    from manual_clock import Clock

    from tracer.clients.consume import ConsumeLoop

    rig = Rig()
    clock = Clock()
    broker, consumer = consumer_with_messages(clock, await_duration=0)
    release = threading.Event()
    started = threading.Event()

    def handler(msg: Any) -> None:
        rig.user_span()
        started.set()
        release.wait(10)

    loop = ConsumeLoop(consumer, handler, monotonic=clock, workers=1, tracer=rig.tracer, handler_timeout=1.0,
                       invisible_duration=30)
    try:
        assert loop.poll() == 1
        assert started.wait(5)
        clock.advance(1.5)
        assert loop.dispatcher.check_timeouts() == 1
        t = threading.Thread(target=loop.run, daemon=True)
        t.start()
        loop.stop(timeout=0.2)
        t.join(10)
        rig.check()
    finally:
        release.set()
        loop.dispatcher.close(timeout=5)


# -- review #31 finding 7 / issue 31 gap (a): a handler still running (no timeout reported) --------------
# Each seam that runs a handler, started with one message whose handler opens a user span and then hangs
# until released. ``stop`` is the seam's bounded stop (None: it has none; its caller's thread just waits).
class Hang:
    def __init__(self, rig: Rig) -> None:
        self.rig, self.started, self.release = rig, threading.Event(), threading.Event()

    def __call__(self, _msg: Any) -> None:
        self.rig.user_span()
        self.started.set()
        self.release.wait(30)

    def consume(self, msg: Any) -> Any:  # a push client's MessageListener
        self(msg)
        return SUCCESS

    async def handle_async(self, _msg: Any) -> None:
        self.rig.user_span()
        self.started.set()
        while not self.release.is_set():
            await asyncio.sleep(0.01)


class ConsumeResult(IntEnum):  # SUCCESS as every push seam reads it: the 5.x enum by name, the 2.x int 0
    SUCCESS = 0


SUCCESS: Any = ConsumeResult.SUCCESS
HANDLER_TIMEOUT_S = 600.0  # set where a seam takes one, never reached: the handler is running, not timed out


class Running:
    """One seam running a hung handler: ``stop()`` is its bounded stop (returns at once while the
    handler runs on), ``finish()`` releases and ends everything."""

    stop: Any = None

    def __init__(self, finish: Any, stop: Any = None) -> None:
        self._finish, self.stop = finish, stop

    def finish(self) -> None:
        self._finish()


def _in_thread(call: Any) -> threading.Thread:
    t = threading.Thread(target=call, daemon=True)
    t.start()
    return t


def _run_consume_loop(rig: Rig, hang: Hang) -> Running:
    from tracer.clients.consume import ConsumeLoop

    _broker, consumer = consumer_with_messages(time.monotonic, await_duration=0)
    loop = ConsumeLoop(consumer, hang, workers=1, tracer=rig.tracer, invisible_duration=30,
                       handler_timeout=HANDLER_TIMEOUT_S)
    t = _in_thread(loop.run)
    return Running(lambda: (loop.stop(timeout=5), t.join(10)), stop=lambda: loop.stop(timeout=0.1))


def _run_demand_push(rig: Rig, hang: Hang) -> Running:
    from tracer.clients.demandpush import DemandPushConsumer
    from tracer.embedded import EmbeddedBroker, Message, Producer

    broker = EmbeddedBroker(min_receive_invisible=1)
    broker.create_topic("T")
    producer = Producer(broker, ["T"])
    producer.startup()
    m = Message()
    m.topic, m.body = "T", b"x"
    producer.send(m)
    push = DemandPushConsumer(broker, "G", hang, {"T": None}, consumption_thread_count=1, tracer=rig.tracer,
                              handler_timeout=HANDLER_TIMEOUT_S, shutdown_timeout=0.1)
    push.startup()
    stopped: list[bool] = []

    def stop() -> None:
        push.shutdown()
        stopped.append(True)

    def finish() -> None:
        hang.release.set()
        if not stopped:
            push.shutdown()

    return Running(finish, stop=stop)


def _run_dispatcher(rig: Rig, hang: Hang) -> Running:
    d = Dispatcher(hang, workers=1, handler_timeout=HANDLER_TIMEOUT_S)
    d.submit("m1", rig.message())
    return Running(lambda: d.close(timeout=5), stop=lambda: d.close(timeout=0))


def _run_async_dispatcher(rig: Rig, hang: Hang) -> Running:
    """The asyncio engine on a loop of its own thread; the provider shuts down while that loop runs."""
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        d: AsyncDispatcher[str] = AsyncDispatcher(hang.handle_async, workers=1, handler_timeout=HANDLER_TIMEOUT_S)
        box["loop"], box["d"] = asyncio.get_running_loop(), d
        await d.submit("m1", rig.message())
        ready.set()
        while not hang.release.is_set():
            await asyncio.sleep(0.01)
        await d.close(timeout=5)

    t = _in_thread(lambda: asyncio.run(main()))
    assert ready.wait(10)

    def stop() -> None:
        asyncio.run_coroutine_threadsafe(box["d"].close(timeout=0), box["loop"]).result(10)

    return Running(lambda: t.join(10), stop=stop)


def _run_processing(rig: Rig, hang: Hang) -> Running:
    from tracer.clients.official import TracedSimpleConsumer

    _broker, raw = consumer_with_messages(time.monotonic, await_duration=0)
    consumer = TracedSimpleConsumer(raw, rig.tracer)

    def run() -> None:
        (msg,) = consumer.receive(1, 30)
        with consumer.processing(msg):
            hang(msg)
        consumer.ack(msg)

    t = _in_thread(run)
    return Running(lambda: t.join(10))


def _run_traced_listener(rig: Rig, hang: Hang) -> Running:
    from test_failed_deliveries import _Pushed

    from tracer.clients.official import TracedListener

    listener = TracedListener(hang, rig.tracer)
    t = _in_thread(lambda: listener.consume(_Pushed()))
    return Running(lambda: t.join(10))


def _push_seam_runner(seam: Any) -> Any:
    from test_failed_deliveries import _Pushed

    from tracer.clients.listener import traced_consume

    def run_push(rig: Rig, hang: Hang) -> Running:
        t = _in_thread(lambda: traced_consume(rig.tracer, seam, hang.consume, _Pushed()))
        return Running(lambda: t.join(10))

    return run_push


# every public class that runs a user's handler, by the name the census below finds it under
RUNNERS: dict[str, Any] = {
    "tracer.dispatch.Dispatcher": _run_dispatcher,
    "tracer.dispatch.AsyncDispatcher": _run_async_dispatcher,
    "tracer.clients.consume.ConsumeLoop": _run_consume_loop,
    "tracer.clients.demandpush.DemandPushConsumer": _run_demand_push,
    "tracer.clients.official.TracedSimpleConsumer": _run_processing,
    "tracer.clients.official.TracedListener": _run_traced_listener,
}


def _seams() -> list[tuple[str, Any]]:
    from test_failed_deliveries import _push_seams

    return [*RUNNERS.items(), *((name, _push_seam_runner(seam)) for name, seam in _push_seams())]


def _handler_runners() -> set[str]:
    """Every public class of the package that runs a user's handler: it takes one (``handler``,
    ``listener``, ``message_listener``) or opens a handler scope around the caller's code
    (``processing``). The push ``Seam`` instances are found by ``_push_seams``."""
    import importlib
    import inspect
    import pkgutil

    import tracer.clients
    import tracer.dispatch

    modules = [tracer.dispatch, *(importlib.import_module(m.name)
                                  for m in pkgutil.iter_modules(tracer.clients.__path__, "tracer.clients."))]
    found = set()
    for mod in modules:
        for name in getattr(mod, "__all__", ()):
            obj = getattr(mod, name)
            if not inspect.isclass(obj) or issubclass(obj, BaseException):
                continue
            try:
                params = set(inspect.signature(obj).parameters)
            except (TypeError, ValueError):
                params = set()
            if params & {"handler", "listener", "message_listener"} or callable(getattr(obj, "processing", None)):
                found.add(f"{mod.__name__}.{name}")
    return found


def test_every_seam_that_runs_a_handler_is_abandoned_at_shutdown_below() -> None:
    """The census: a new engine or seam must join the two tests below (issue 31 gap (a))."""
    assert _handler_runners() == set(RUNNERS)


def _check_abandoned(rig: Rig) -> None:
    spans = rig.exporter.get_finished_spans()
    ids = {s.context.span_id for s in spans}
    orphans = [s.name for s in spans if s.parent is not None and not s.parent.is_remote
               and s.parent.span_id not in ids]
    assert orphans == []  # fails before: ['user-work'] (no handler, no process span)
    rig.check()
    [process] = [s for s in spans if s.name == "process T"]
    assert process.attributes["rmqtrace.outcome"] == "timeout"
    assert process.attributes[n.ERROR_TYPE] == "HandlerAbandoned"


@pytest.mark.parametrize(("name", "run"), _seams(), ids=[name for name, _ in _seams()])
def test_a_handler_running_at_the_providers_shutdown_has_its_spans_ended_abandoned(name: str, run: Any) -> None:
    """Before, only a handler already reported TIMEOUT was abandoned: without ``handler_timeout``
    (the default), or before it passed, a handler still running at ``provider.shutdown()``
    (SIGTERM, atexit) had no handler or process span, and the user's span under it was exported
    as an orphan. Every seam that runs a handler: both dispatcher engines, the loop, the push
    replacement, ``processing()``, the push listeners."""
    rig = Rig()
    hang = Hang(rig)
    running = run(rig, hang)
    try:
        assert hang.started.wait(10)
        rig.provider.shutdown()
        _check_abandoned(rig)
    finally:
        hang.release.set()
        running.finish()
    # the late return ends nothing twice
    assert [s.name for s in rig.exporter.get_finished_spans()].count("handler") == 1


STOPPABLE = [(name, run) for name, run in RUNNERS.items() if name.rsplit(".", 1)[1] in
             ("Dispatcher", "AsyncDispatcher", "ConsumeLoop", "DemandPushConsumer")]


@pytest.mark.parametrize("then", ["provider_shutdown", "handler_returns"])
@pytest.mark.parametrize(("name", "run"), STOPPABLE, ids=[name for name, _ in STOPPABLE])
def test_a_handler_still_running_after_a_bounded_stop(name: str, run: Any, then: str) -> None:
    """Issue 31 gap (a): a bounded stop (``close(timeout=0)``, ``stop(timeout=)``, ``shutdown()``
    with ``shutdown_timeout``) returns while a handler runs, not yet past its ``handler_timeout``.
    Its spans stay open for it (the documented promise: it goes on and is settled when it ends):
    when it returns it is a plain success, never marked abandoned; should the provider shut down
    first, the handler span ends then, abandoned, and the message is measured once."""
    rig = Rig()
    hang = Hang(rig)
    running = run(rig, hang)
    try:
        assert hang.started.wait(10)
        running.stop()
        assert "handler" not in {s.name for s in rig.exporter.get_finished_spans()}, "ended while it runs"
        if then == "provider_shutdown":
            rig.provider.shutdown()
            _check_abandoned(rig)
        else:
            hang.release.set()
            wait_until(lambda: "process T" in {s.name for s in rig.exporter.get_finished_spans()},
                       what="the late handler's trace ends")
            spans = {s.name: s for s in rig.exporter.get_finished_spans()}
            assert spans["process T"].attributes["rmqtrace.outcome"] == "success"
            assert n.ABANDONED not in spans["handler"].attributes
            assert spans["user-work"].parent.span_id == spans["handler"].context.span_id
    finally:
        hang.release.set()
        running.finish()
    assert [s.name for s in rig.exporter.get_finished_spans()].count("handler") == 1
