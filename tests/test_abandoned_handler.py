"""Issue 31 item 9: a timed-out handler's span is ended when the handler is let go.

A handler reported ``TIMEOUT`` while it still runs keeps its ``handler`` span open for its late
return (the user's spans nest under it). Before, when that return never came before a
dispatcher's ``close``/``stop(timeout=)`` or the provider's shutdown, the span was never
exported and the user's span under it was an orphan. Now it ends then, status ERROR,
``rmqtrace.abandoned``. Both dispatcher engines and the provider shutdown; ConsumeLoop's
``stop(timeout=)`` (and DemandPushConsumer, which stops through it) ride the thread engine's close.
"""

from __future__ import annotations

import asyncio
import threading
import time
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


# -- review #31 finding 7: a handler still running (no timeout reported) at the provider's shutdown --
def _in_thread(call: Any) -> threading.Thread:
    t = threading.Thread(target=call, daemon=True)
    t.start()
    return t


def _run_consume_loop(rig: Rig, handler: Any) -> Any:
    from tracer.clients.consume import ConsumeLoop

    _broker, consumer = consumer_with_messages(time.monotonic, await_duration=0)
    loop = ConsumeLoop(consumer, handler, workers=1, tracer=rig.tracer, invisible_duration=30)  # no handler_timeout
    t = _in_thread(loop.run)
    return lambda: (loop.stop(timeout=5), t.join(10))


def _run_dispatcher(rig: Rig, handler: Any) -> Any:
    d = Dispatcher(handler, workers=1)
    d.submit("m1", rig.message())
    return lambda: d.close(timeout=5)


def _run_processing(rig: Rig, handler: Any) -> Any:
    from tracer.clients.official import TracedSimpleConsumer

    _broker, raw = consumer_with_messages(time.monotonic, await_duration=0)
    consumer = TracedSimpleConsumer(raw, rig.tracer)

    def run() -> None:
        (msg,) = consumer.receive(1, 30)
        with consumer.processing(msg):
            handler(msg)
        consumer.ack(msg)

    t = _in_thread(run)
    return lambda: t.join(10)


def _push_seam_runner(seam: Any) -> Any:
    from test_failed_deliveries import _Pushed

    from tracer.clients.listener import traced_consume

    def run_push(rig: Rig, handler: Any) -> Any:
        t = _in_thread(lambda: traced_consume(rig.tracer, seam, handler, _Pushed()))
        return lambda: t.join(10)

    return run_push


def _seams() -> list[tuple[str, Any]]:
    from test_failed_deliveries import _push_seams

    return [("ConsumeLoop", _run_consume_loop), ("Dispatcher", _run_dispatcher),
            ("TracedSimpleConsumer.processing", _run_processing),
            *((name, _push_seam_runner(seam)) for name, seam in _push_seams())]


@pytest.mark.parametrize(("name", "run"), _seams(), ids=[name for name, _ in _seams()])
def test_a_handler_running_at_the_providers_shutdown_has_its_spans_ended_abandoned(name: str, run: Any) -> None:
    """Before, only a handler already reported TIMEOUT was abandoned: without ``handler_timeout``
    (the default) a handler still running at ``provider.shutdown()`` (SIGTERM, atexit) had no
    handler or process span, and the user's span under it was exported as an orphan. Every seam
    that opens a handler scope: the loop, the dispatcher, ``processing()``, the push callbacks."""
    rig = Rig()
    release, started = threading.Event(), threading.Event()

    def handler(_msg: Any) -> None:
        rig.user_span()
        started.set()
        release.wait(10)

    finish = run(rig, handler)
    try:
        assert started.wait(10)
        rig.provider.shutdown()
        spans = rig.exporter.get_finished_spans()
        ids = {s.context.span_id for s in spans}
        orphans = [s.name for s in spans if s.parent is not None and not s.parent.is_remote
                   and s.parent.span_id not in ids]
        assert orphans == []  # fails before: ['user-work'] (no handler, no process span)
        rig.check()
        [process] = [s for s in spans if s.name == "process T"]
        assert process.attributes["rmqtrace.outcome"] == "timeout"
        assert process.attributes[n.ERROR_TYPE] == "HandlerAbandoned"
    finally:
        release.set()
        finish()
    # the late return ends nothing twice
    assert [s.name for s in rig.exporter.get_finished_spans()].count("handler") == 1
