"""MessageTracer's environment is one frozen TracerConfig, read once; the keywords `client=` replaced warn."""

from __future__ import annotations

import warnings

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tracer.path.message import ClientFacts
from tracer.telemetry.tracer import MessageTracer
from tracer.telemetry.tracerconfig import TracerConfig
from tracer.telemetry.tracercore import LOOSE_CLIENT_KEYWORDS


def _provider() -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    return provider


def test_from_env_reads_the_shape_and_the_keep_variables_and_the_keyword_wins() -> None:
    env = {"RMQTRACE_TRACE_SHAPE": " Compact ", "RMQTRACE_KEEP_CONSUMER_WAIT": "0.1", "OTEL_SERVICE_NAME": "x"}
    config = TracerConfig.from_env(env)
    assert config.trace_shape == "compact" and config.compact
    assert dict(config.keep_env) == {"RMQTRACE_KEEP_CONSUMER_WAIT": "0.1"}
    assert TracerConfig.from_env(env, trace_shape="full").trace_shape == "full"
    assert TracerConfig.from_env({}) == TracerConfig()
    with pytest.raises(ValueError, match="RMQTRACE_TRACE_SHAPE"):
        TracerConfig.from_env({"RMQTRACE_TRACE_SHAPE": "tiny"})
    with pytest.raises(AttributeError):
        config.trace_shape = "full"  # type: ignore[misc]


def test_the_tracer_uses_the_config_it_is_given_and_trace_shape_wins_over_it() -> None:
    provider = _provider()
    assert MessageTracer(tracer_provider=provider, config=TracerConfig("compact")).compact
    assert not MessageTracer(tracer_provider=provider, config=TracerConfig("compact"), trace_shape="full").compact


def test_keep_applied_on_first_use_is_the_one_read_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    """The global provider comes after the tracer (opentelemetry-instrument): writer() applies the
    RMQTRACE_KEEP_* the constructor read, not what the environment says by then. Before, writer()
    read the environment again: a variable removed in between left the tracer without its policy."""
    later = _provider()
    current: list[object] = [trace.ProxyTracerProvider()]
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: current[0])
    monkeypatch.setenv("RMQTRACE_KEEP_CONSUMER_WAIT", "0.1")
    mt = MessageTracer(consumer_group="G")
    assert mt.keep is None and dict(mt.config.keep_env) == {"RMQTRACE_KEEP_CONSUMER_WAIT": "0.1"}
    monkeypatch.delenv("RMQTRACE_KEEP_CONSUMER_WAIT")
    current[0] = later
    assert mt.writer() is not None
    assert mt.keep is not None and mt.hold is not None
    assert mt.keep.thresholds["consumer_wait"] == pytest.approx(0.1)


_LOOSE_VALUES = {"client_id": "host@1@c", "namespace": "ns", "server_address": "broker.example", "server_port": 8081}


@pytest.mark.parametrize("keyword", LOOSE_CLIENT_KEYWORDS)
def test_a_loose_client_keyword_still_works_and_warns(keyword: str) -> None:
    facts = ClientFacts("given", "given-ns", "given.example", 9876)
    with pytest.warns(DeprecationWarning, match=rf"MessageTracer\({keyword}=\) is deprecated: pass client="):
        mt = MessageTracer(tracer_provider=_provider(), client=facts, **{keyword: _LOOSE_VALUES[keyword]})
    assert mt.client == facts._replace(**{keyword: _LOOSE_VALUES[keyword]})  # it overrides its field


def test_client_facts_alone_warn_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mt = MessageTracer(tracer_provider=_provider(), client=ClientFacts("c", "ns", "b.example", 8081))
    assert mt.client_id == "c" and mt.namespace == "ns"


def test_the_deprecation_names_the_callers_line() -> None:
    with pytest.warns(DeprecationWarning) as caught:
        MessageTracer(tracer_provider=_provider(), client_id="x")
    assert caught[0].filename == __file__


def test_received_traces_bound_themselves_by_the_tracers_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no hold on the tracer (a provider the policy cannot apply to), the received traces'
    bounds are RMQTRACE_KEEP_HELD_* as the tracer read them. Before, they were read again, at the
    first receive, into a process-wide cache: a variable changed in between (or another tracer's
    configuration) was what counted."""
    from tracer.clients.official import ReceivedTraces

    monkeypatch.setenv("RMQTRACE_KEEP_HELD_AGE", "7")
    monkeypatch.setenv("RMQTRACE_KEEP_HELD_SPANS", "9")
    mt = MessageTracer(consumer_group="G", tracer_provider=trace.NoOpTracerProvider())
    assert mt.hold is None  # not the SDK's provider: no policy applies (a warning says so)
    monkeypatch.delenv("RMQTRACE_KEEP_HELD_AGE")
    monkeypatch.delenv("RMQTRACE_KEEP_HELD_SPANS")
    assert ReceivedTraces(mt).limits() == (7 * 10**9, 9)
    other = MessageTracer(consumer_group="G", tracer_provider=trace.NoOpTracerProvider(),
                          config=TracerConfig(keep_env={"RMQTRACE_KEEP_HELD_AGE": "3"}))
    assert ReceivedTraces(other).limits() == (3 * 10**9, 20_000)


def test_a_config_s_keep_variables_apply_to_the_provider_at_construction() -> None:
    config = TracerConfig(keep_env={"RMQTRACE_KEEP_END_TO_END": "2", "RMQTRACE_KEEP_HELD_SPANS": "50"})
    mt = MessageTracer(consumer_group="G", tracer_provider=_provider(), config=config)
    assert mt.keep is not None and mt.keep.thresholds["end_to_end"] == pytest.approx(2.0)
    assert mt.hold is not None and mt.hold.max_traces == 50
    assert MessageTracer(tracer_provider=_provider(), config=TracerConfig()).keep is None


def test_a_bad_keep_variable_is_a_loud_error_at_construction() -> None:
    with pytest.raises(ValueError, match="RMQTRACE_KEEP_END_TO_END"):
        MessageTracer(tracer_provider=_provider(), config=TracerConfig(keep_env={"RMQTRACE_KEEP_END_TO_END": "soon"}))
