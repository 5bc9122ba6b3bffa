"""Every producer seam says, in one line, whether the broker is down or the topic missing (issue 33).

The clients say the same thing for both — the 5.x client "failed to fetch topic:T route.", the 2.x
client "No route info of this topic: T,error:-1,in file <…DefaultMQProducerImpl.cpp> line:434"
(measured: its name server at 127.0.0.1:1) — so an app built from the README with no broker died
with the client's own words. ``TracedProducer.send`` was fixed first; its siblings were built the
same way and missed it: ``send_async`` (the 5.x client raises the route failure from the call, not
through the future), the instrumentor's ``send_async`` wrapper, and every 2.x send. This test finds
every function of the package that sends through the traced-send helpers, so a new seam cannot be
added without a driver here that proves it explains the failure.

The 5.x seams run the real client against 127.0.0.1:1 (nothing listens there: no service needed)
and, as an integration test, against the real proxy with a topic that does not exist. The 2.x
client cannot share this venv with the 5.x one: its seams run on a fake ``rocketmq.client`` that
raises the real client's words (its real run: tests/legacy_programs/roundtrip.py).
"""

from __future__ import annotations

import ast
import socket
import sys
import types
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from conftest import REPO
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry

from tracer import MessageTracer
from tracer.clients.producer import JobSendError
from tracer.clients.route import RouteProblem, TopicRouteError

rmq = pytest.importorskip("rocketmq")

SEND_HELPERS = {"traced_send", "traced_send_async", "traced_legacy_send", "send_ordered"}
NOBODY = "127.0.0.1:1"  # nothing listens on port 1 (privileged, never bound here)


def discovered_seams() -> set[str]:
    """``module.Class.function`` of every function in tracer/ that calls a traced-send helper."""
    found: set[str] = set()
    for path in sorted((REPO / "tracer").rglob("*.py")):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts)

        def visit(node: ast.AST, prefix: str) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.ClassDef):
                    visit(child, f"{prefix}.{child.name}")
                elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    called = {c.func.id if isinstance(c.func, ast.Name) else c.func.attr
                              for c in ast.walk(child) if isinstance(c, ast.Call)
                              and isinstance(c.func, (ast.Name, ast.Attribute))}
                    if called & SEND_HELPERS:
                        found.add(f"{prefix}.{child.name}")

        visit(ast.parse(path.read_text(encoding="utf-8")), module)
    return found


# -- the 5.x client, real ---------------------------------------------------------------------------
def _message(topic: str) -> Any:
    msg = rmq.Message()
    msg.topic, msg.keys, msg.body = topic, "tg-1", b"{}"
    return msg


@contextmanager
def _producer5(endpoint: str) -> Iterator[Any]:
    producer = rmq.Producer(rmq.ClientConfiguration(endpoint, rmq.Credentials()))
    producer.startup()  # asks nothing of the endpoint yet: the first send fetches the route
    try:
        yield producer
    finally:
        producer.shutdown()


@contextmanager
def _instrumented5() -> Iterator[None]:
    from tracer.clients.instrumentor import RocketMQInstrumentor

    inst = RocketMQInstrumentor()
    inst.instrument(tracer_provider=TracerProvider(), registry=CollectorRegistry())
    try:
        yield
    finally:
        inst.uninstrument()


def _traced5(call: Callable[[Any, Any], Any]) -> Callable[[str, str], Any]:
    from tracer import TracedProducer

    def drive(endpoint: str, topic: str) -> Any:
        with _producer5(endpoint) as raw:
            return call(TracedProducer(raw, MessageTracer(tracer_provider=TracerProvider())), _message(topic))
    return drive


def _instrumented_call5(method: str) -> Callable[[str, str], Any]:
    def drive(endpoint: str, topic: str) -> Any:
        with _instrumented5(), _producer5(endpoint) as raw:
            return getattr(raw, method)(_message(topic))
    return drive


# -- the 2.x client, its API and words on a fake module ----------------------------------------------
class _ProducerSendSyncFailed(Exception):  # rocketmq.exceptions.ProducerSendSyncFailed's shape
    pass


class _LegacyMessage:
    """A 2.x message (setters), carrying its fields as attributes as a user's subclass may."""

    def __init__(self, topic: str) -> None:
        self.topic, self.tags, self.keys, self.props = topic, b"", b"tg-1", {}

    def set_property(self, key: str, value: str) -> None:
        self.props[key] = value


class _LegacyProducer:
    """rocketmq.client.Producer's surface; every send fails as the real one does with no route."""

    def __init__(self, group_id: str = "pg") -> None:
        self.name_server: str | None = None

    def set_name_server_address(self, addr: str) -> None:
        self.name_server = addr

    def start(self) -> None:
        pass

    def send_sync(self, msg: _LegacyMessage) -> Any:
        raise _ProducerSendSyncFailed(f"No route info of this topic: {msg.topic},error:-1,in file "
                                      "</opt/app/test/rocketmq-client-cpp-2.1.0/src/producer/DefaultMQProducerImpl.cpp> "
                                      "line:434")

    def send_orderly_with_sharding_key(self, msg: _LegacyMessage, key: str) -> Any:
        return self.send_sync(msg)

    def send_oneway(self, msg: _LegacyMessage) -> Any:
        return self.send_sync(msg)


def _legacy_class() -> type:
    """A fresh class with the 2.x Producer's methods defined on itself, as the real one has them."""
    return type("Producer", (), {k: v for k, v in _LegacyProducer.__dict__.items()
                                 if not k.startswith("__") or k == "__init__"})


@contextmanager
def _instrumented2(monkeypatch: pytest.MonkeyPatch, cls: type) -> Iterator[None]:
    import tracer.clients.instrumentor as inst_mod

    fake = types.ModuleType("rocketmq.client")
    fake.Producer = cls  # type: ignore[attr-defined]
    fake.PushConsumer = type("PushConsumer", (), {"__init__": lambda self, group_id: None,  # type: ignore[attr-defined]
                                                  "subscribe": lambda self, topic, callback: None})
    monkeypatch.setitem(sys.modules, "rocketmq.client", fake)
    monkeypatch.setattr(inst_mod, "_legacy_only", lambda: True)
    inst = inst_mod.RocketMQInstrumentor()
    inst.instrument(tracer_provider=TracerProvider(), registry=CollectorRegistry(), skip_dep_check=True)
    try:
        yield
    finally:
        inst.uninstrument()


# name server: an address, or None for "set before rmqtrace saw it"
Legacy = Callable[[pytest.MonkeyPatch, "str | None", str], Any]


def _wrapped2(call: Callable[[Any, _LegacyMessage], Any]) -> Legacy:
    from tracer.clients.legacy import TracedLegacyProducer

    def drive(monkeypatch: pytest.MonkeyPatch, name_server: str | None, topic: str) -> Any:
        raw = _LegacyProducer()
        producer = TracedLegacyProducer(raw, MessageTracer(tracer_provider=TracerProvider()))
        (producer if name_server else raw).set_name_server_address(name_server or "10.0.0.1:9876")
        return call(producer, _LegacyMessage(topic))
    return drive


def _bare2(monkeypatch: pytest.MonkeyPatch, name_server: str | None, topic: str) -> Any:
    from tracer.clients import legacy

    raw = _LegacyProducer()
    if name_server:
        legacy.remember_name_server(raw, name_server)
    return legacy.traced_legacy_send(MessageTracer(tracer_provider=TracerProvider()), raw.send_sync, _LegacyMessage(topic))


def _instrumented_call2(method: str) -> Legacy:
    def drive(monkeypatch: pytest.MonkeyPatch, name_server: str | None, topic: str) -> Any:
        cls = _legacy_class()
        producer = cls()
        if name_server is None:  # set before instrument(): the instrumentor never saw it
            producer.set_name_server_address("10.0.0.1:9876")
        with _instrumented2(monkeypatch, cls):
            if name_server is not None:
                producer.set_name_server_address(name_server)
            return getattr(producer, method)(_LegacyMessage(topic))
    return drive


def _job(producer: Any, msg: Any) -> Any:
    return producer.send_job([msg], cost=lambda m: 1.0, job_id="job-42")


@dataclass(frozen=True)
class Seam:
    client: str  # "5.x" or "2.x"
    drive: Any  # (endpoint, topic) for 5.x; (monkeypatch, name server, topic) for 2.x


SEAMS: dict[str, Seam] = {
    "tracer.clients.producer.TracedProducer.send": Seam("5.x", _traced5(lambda p, m: p.send(m))),
    "tracer.clients.producer.TracedProducer.send_async": Seam("5.x", _traced5(lambda p, m: p.send_async(m).result(30))),
    "tracer.clients.producer.TracedProducer.send_job": Seam("5.x", _traced5(_job)),
    "tracer.clients.instrumentor.RocketMQInstrumentor._send": Seam("5.x", _instrumented_call5("send")),
    "tracer.clients.instrumentor.RocketMQInstrumentor._send_async":
        Seam("5.x", _instrumented_call5("send_async")),
    "tracer.clients.legacy.traced_legacy_send": Seam("2.x", _bare2),
    "tracer.clients.legacy.TracedLegacyProducer.send_sync": Seam("2.x", _wrapped2(lambda p, m: p.send_sync(m))),
    "tracer.clients.legacy.TracedLegacyProducer.send_orderly_with_sharding_key":
        Seam("2.x", _wrapped2(lambda p, m: p.send_orderly_with_sharding_key(m, "k"))),
    "tracer.clients.legacy.TracedLegacyProducer.send_oneway": Seam("2.x", _wrapped2(lambda p, m: p.send_oneway(m))),
    "tracer.clients.legacy.TracedLegacyProducer.send_job": Seam("2.x", _wrapped2(_job)),
    "tracer.clients.instrumentor.RocketMQInstrumentor._legacy_send": Seam("2.x", _instrumented_call2("send_sync")),
}
S5 = sorted(k for k, s in SEAMS.items() if s.client == "5.x")
S2 = sorted(k for k, s in SEAMS.items() if s.client == "2.x")


def test_every_seam_that_sends_through_the_traced_send_helpers_has_a_driver_here() -> None:
    assert discovered_seams() == set(SEAMS)


def _explained(exc: BaseException) -> TopicRouteError:
    """The route error a seam raised: itself, or what ``send_job`` names as its cause."""
    if isinstance(exc, JobSendError):
        assert isinstance(exc.__cause__, TopicRouteError), repr(exc.__cause__)
        assert str(exc.__cause__) in str(exc)  # the job's own line carries it
        return exc.__cause__
    assert isinstance(exc, TopicRouteError), f"{type(exc).__name__}: {exc}"
    return exc


def _one_clear_line(exc: BaseException, *says: str) -> None:
    text = str(exc)
    assert "\n" not in text and all(s in text for s in says), text
    assert "failed to fetch" not in text and "No route info" not in text and ".cpp" not in text, text


@pytest.mark.parametrize("seam", S5)
def test_a_5x_seam_with_no_broker_says_so_and_what_to_do(seam: str) -> None:
    with pytest.raises(Exception) as info:
        SEAMS[seam].drive(NOBODY, "jobs")
    err = _explained(info.value)
    assert err.problem is RouteProblem.BROKER_DOWN
    assert str(err.client_error) == "failed to fetch topic:jobs route."
    _one_clear_line(info.value, f"no RocketMQ proxy answers at {NOBODY}", "`make stack`")


@pytest.mark.integration
@pytest.mark.parametrize("seam", S5)
def test_a_5x_seam_with_a_missing_topic_says_so_and_how_to_create_it(seam: str) -> None:
    from rmq_real import ENDPOINT, ensure_broker

    ensure_broker()
    topic = f"t33-missing-{uuid.uuid4().hex[:10]}"  # never created
    with pytest.raises(Exception) as info:
        SEAMS[seam].drive(ENDPOINT, topic)
    assert _explained(info.value).problem is RouteProblem.TOPIC_MISSING
    _one_clear_line(info.value, f"topic {topic!r} does not exist", f"rmq.sh topic {topic}")


@pytest.fixture
def listening() -> Iterator[str]:
    """A name server's address that accepts connections (a bare listening socket)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield f"127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize("seam", S2)
@pytest.mark.parametrize("case", ["name-server-down", "topic-missing", "address-unseen"])
def test_a_2x_seam_says_which_it_is_and_what_to_do(seam: str, case: str, listening: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    name_server = {"name-server-down": NOBODY, "topic-missing": listening, "address-unseen": None}[case]
    with pytest.raises(Exception) as info:
        SEAMS[seam].drive(monkeypatch, name_server, "jobs")
    err = _explained(info.value)
    assert str(err.client_error).startswith("No route info of this topic: jobs,")
    if case == "name-server-down":
        assert err.problem is RouteProblem.BROKER_DOWN
        _one_clear_line(info.value, f"no RocketMQ name server answers at {NOBODY}", "`make stack`")
    elif case == "topic-missing":
        assert err.problem is RouteProblem.TOPIC_MISSING
        _one_clear_line(info.value, f"the name server at {listening} has no route for topic 'jobs'",
                        "rmq.sh topic jobs")
    else:
        assert err.problem is RouteProblem.UNCHECKED
        _one_clear_line(info.value, "no name server answers", "`make stack`", "rmq.sh topic jobs")


def test_another_send_error_passes_through_untouched() -> None:
    """Only the route failure is explained: a refused message is the client's own error."""
    from tracer import TracedProducer

    refused = rmq.IllegalArgumentException("message body is none.") if hasattr(rmq, "IllegalArgumentException") \
        else ValueError("message body is none.")
    raw = types.SimpleNamespace(send_async=lambda m: (_ for _ in ()).throw(refused), client_configuration=None)
    with pytest.raises(type(refused)) as info:
        TracedProducer(raw, MessageTracer(tracer_provider=TracerProvider())).send_async(_message("jobs"))
    assert info.value is refused


def test_any_name_server_of_a_list_that_answers_makes_it_the_topics_fault(listening: str) -> None:
    """The 2.x address is "host:port;host:port": one that answers means the route is missing; none
    (refused, no such host, a port past 65535, no port) means no name server."""
    from tracer.clients.route import check_name_server

    assert check_name_server(f"127.0.0.1:99999;nosuchhost.invalid:9876;{NOBODY};{listening}") is RouteProblem.TOPIC_MISSING
    assert check_name_server(f"127.0.0.1:99999;nosuchhost.invalid:9876;{NOBODY};no-port") is RouteProblem.BROKER_DOWN
