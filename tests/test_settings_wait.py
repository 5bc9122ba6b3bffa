"""The 5.1.2 client's startup race: a receive before the proxy's settings fails ("settings" is null)
and the consume loop logged it with a 30-line traceback on the README's first program (issue 33).
Every seam that receives waits for the client's settings first (tracer/clients/startup.py)."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from test_consume import pipeline

from tracer.clients.official import TracedSimpleConsumer
from tracer.clients.startup import SETTINGS_ATTR, wait_for_settings
from tracer.telemetry.tracer import MessageTracer


class InternalErrorException(Exception):
    """As the 5.1.2 client names it."""


class SettingsArriveLater(threading.Event):
    """The proxy's settings: they arrive while someone waits for them, or just after a receive was
    refused for want of them."""

    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        self.set()
        return True


class RacyClient:
    """An embedded SimpleConsumer that refuses receives until its settings arrived, as 5.1.2 does."""

    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer
        setattr(self, SETTINGS_ATTR, SettingsArriveLater())
        self.refused = 0

    def receive(self, *args: Any, **kwargs: Any) -> Any:
        settings = getattr(self, SETTINGS_ATTR)
        if not settings.is_set():
            self.refused += 1
            settings.set()  # they come a moment later
            raise InternalErrorException('receive failed: CODE 50001, "settings" is null')
        return self._consumer.receive(*args, **kwargs)

    def receive_async(self, *args: Any, **kwargs: Any) -> Any:
        from concurrent.futures import Future

        fut: Future[Any] = Future()
        fut.set_result(self.receive(*args, **kwargs))  # raises as 5.1.2's does before its settings
        return fut

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


def _loud(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("tracer")]


def test_the_consume_loop_waits_for_the_settings_before_its_first_receive(caplog: pytest.LogCaptureFixture) -> None:
    racy: list[RacyClient] = []

    def wrap(consumer: Any) -> RacyClient:
        racy.append(RacyClient(consumer))
        return racy[0]

    _, loop = pipeline(2, lambda m: None, consumer_wrapper=wrap, workers=1)
    with caplog.at_level(logging.DEBUG):
        stats = loop.run(until=lambda s: s.acked >= 2)
    assert (stats.acked, stats.receive_errors, racy[0].refused) == (2, 0, 0)  # fails before: refused 1, logged
    assert _loud(caplog) == []


def test_the_traced_simple_consumer_waits_for_the_settings_before_its_first_receive() -> None:
    racy: list[RacyClient] = []

    def wrap(consumer: Any) -> RacyClient:
        racy.append(RacyClient(consumer))
        return racy[0]

    _, loop = pipeline(1, lambda m: None, consumer_wrapper=wrap)
    loop.stop(timeout=5)  # only its consumer is used here
    traced = TracedSimpleConsumer(racy[0], MessageTracer())
    got = traced.receive(1, 30)
    assert len(got) == 1 and racy[0].refused == 0
    assert getattr(racy[0], SETTINGS_ATTR).waits == 1
    traced.receive(1, 30)
    assert getattr(racy[0], SETTINGS_ATTR).waits == 1  # once: later receives do not wait


def test_wait_for_settings_reads_the_client_or_its_wrapper_and_stops_when_asked() -> None:
    class Plain:
        pass

    assert wait_for_settings(Plain()) is None  # embedded, 2.x: nothing to wait for
    client = Plain()
    setattr(client, SETTINGS_ATTR, threading.Event())
    assert wait_for_settings(client, 0) is False
    wrapper = Plain()
    wrapper.wrapped = client  # type: ignore[attr-defined]
    getattr(client, SETTINGS_ATTR).set()
    assert wait_for_settings(wrapper, 0) is True
    setattr(client, SETTINGS_ATTR, threading.Event())
    stop = threading.Event()
    stop.set()
    assert wait_for_settings(client, 3600, stop) is False  # a stop ends the wait at once
    with pytest.raises(ValueError, match="timeout"):
        wait_for_settings(client, float("nan"))


# -- every seam that receives: found in the source, each driven against the racy client ----------------
def receive_seams() -> set[str]:
    """``module.Class.method`` of every function of tracer/clients that calls a ``receive`` or
    ``receive_async`` (the client's, or the operations' that wraps the client's)."""
    import ast

    from conftest import REPO

    found = set()
    for path in sorted((REPO / "tracer" / "clients").glob("*.py")):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts)
        for cls in [n for n in ast.parse(path.read_text(encoding="utf-8")).body if isinstance(n, ast.ClassDef)]:
            for fn in [n for n in cls.body if isinstance(n, ast.FunctionDef)]:
                if any(isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                       and c.func.attr in ("receive", "receive_async") for c in ast.walk(fn)):
                    found.add(f"{module}.{cls.name}.{fn.name}")
    return found


def _racy() -> RacyClient:
    racy: list[RacyClient] = []
    _, loop = pipeline(1, lambda m: None, consumer_wrapper=lambda c: racy.append(RacyClient(c)) or racy[0])
    loop.dispatcher.close()
    return racy[0]


def _traced(method: str) -> Any:
    def drive() -> RacyClient:
        racy = _racy()
        got = getattr(TracedSimpleConsumer(racy, MessageTracer()), method)(1, 30)
        assert len(got if method == "receive" else got.result(10)) == 1
        return racy
    return drive


def _instrumented(method: str) -> Any:
    def drive() -> RacyClient:
        from opentelemetry.sdk.trace import TracerProvider
        from prometheus_client import CollectorRegistry

        from tracer.clients.instrumentor import RocketMQInstrumentor

        pytest.importorskip("rocketmq")
        racy = _racy()
        inst = RocketMQInstrumentor()
        inst.instrument(tracer_provider=TracerProvider(), registry=CollectorRegistry())
        try:  # the wrapper as wrapt calls it for a patched SimpleConsumer.receive
            got = getattr(inst, f"_{method}")(getattr(racy, method), racy, (1, 30), {})
        finally:
            inst.uninstrument()
        assert len(got if method == "receive" else got.result(10)) == 1
        return racy
    return drive


def _polled() -> RacyClient:
    racy: list[RacyClient] = []
    _, loop = pipeline(1, lambda m: None, consumer_wrapper=lambda c: racy.append(RacyClient(c)) or racy[0])
    try:
        loop.poll()
    finally:
        loop.stop(timeout=5)
        loop.dispatcher.close()  # a polled loop's stop() only asks
    return racy[0]


SETTINGS_SEAMS = {
    "tracer.clients.official.TracedSimpleConsumer.receive": _traced("receive"),
    "tracer.clients.official.TracedSimpleConsumer.receive_async": _traced("receive_async"),
    "tracer.clients.instrumentor.RocketMQInstrumentor._receive": _instrumented("receive"),
    "tracer.clients.instrumentor.RocketMQInstrumentor._receive_async": _instrumented("receive_async"),
    "tracer.clients.consume.ConsumeLoop.poll": _polled,  # run() waits: test above
}


def test_every_receive_seam_has_a_driver_here() -> None:
    assert receive_seams() == set(SETTINGS_SEAMS)


@pytest.mark.parametrize("seam", sorted(SETTINGS_SEAMS))
def test_every_receive_seam_waits_for_the_settings_before_its_first_receive(seam: str) -> None:
    racy = SETTINGS_SEAMS[seam]()
    assert racy.refused == 0 and getattr(racy, SETTINGS_ATTR).waits == 1, seam
