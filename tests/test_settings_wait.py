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
