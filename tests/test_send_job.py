"""``TracedProducer.send_job`` (issue #34 item 1) and the order it records, read back by the
consumer's span, the report's job view and ``--costs`` (items 2 and 4)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
from report_helpers import KNOWN, scenario_spans

from tracer.clients.producer import TracedProducer, ordered_job
from tracer.dispatch.cost import message_key
from tracer.dispatch.costtable import CostTable, CostTableError, load_costs
from tracer.embedded import EmbeddedBroker, Message, Producer, SimpleConsumer
from tracer.path import names
from tracer.path.message import MessageInfo
from tracer.path.stages import Outcome, Stage
from tracer.report.model import MIXED_ORDER, messages_from_spans, report_from_messages, sent_order
from tracer.telemetry.spanfile import SpanRecord
from tracer.telemetry.tracer import MessageTracer

COSTS = {"g0": 0.5, "g1": 4.0, "g2": 0.5, "g3": 2.0, "g4": 0.1}


def _job() -> list[Message]:
    out = []
    for key in COSTS:
        m = Message()
        m.topic, m.body, m.keys = "T", key.encode(), key
        out.append(m)
    return out


def _rig() -> tuple[EmbeddedBroker, TracedProducer, SimpleConsumer]:
    broker = EmbeddedBroker(min_receive_invisible=1)
    broker.create_topic("T")
    producer = TracedProducer(Producer(broker, ["T"]), MessageTracer())
    producer.startup()
    consumer = SimpleConsumer(broker, "G", {"T": None})
    consumer.startup()
    return broker, producer, consumer


def _received(consumer: SimpleConsumer) -> list[Any]:
    got = consumer.receive(100, 10)
    for m in got:
        consumer.ack(m)
    return got


def test_longest_first_in_send_order_with_job_cost_and_order_on_each() -> None:
    _, producer, consumer = _rig()
    receipts = producer.send_job(_job(), cost=lambda m: COSTS[message_key(m)], job_id="J")
    got = _received(consumer)
    assert len(receipts) == 5
    assert [message_key(m) for m in got] == ["g1", "g3", "g0", "g2", "g4"]  # stable: g0 before g2
    for m in got:
        p = m.properties
        assert p[names.JOB_ID_PROPERTY] == "J"
        assert float(p[names.COST_PROPERTY]) == COSTS[m.body.decode()]
        assert p[names.JOB_ORDER_PROPERTY] == "longest_first"


def test_arrival_order_and_a_cost_table() -> None:
    _, producer, consumer = _rig()
    producer.send_job(_job(), cost=CostTable({"g1": 9.0}), order="arrival")
    got = _received(consumer)
    assert [m.body.decode() for m in got] == list(COSTS)
    # g1 from the table, the rest the table's default (its median: 9.0, the only entry)
    assert [float(m.properties[names.COST_PROPERTY]) for m in got] == [9.0] * 5
    assert {m.properties[names.JOB_ORDER_PROPERTY] for m in got} == {"arrival"}


def test_one_at_a_time_sends_carry_no_order() -> None:
    _, producer, consumer = _rig()
    m = _job()[0]
    producer.send(m, job_id="J", cost=1.0)
    (got,) = _received(consumer)
    assert names.JOB_ORDER_PROPERTY not in got.properties
    assert got.properties[names.JOB_ID_PROPERTY] == "J"


@pytest.mark.parametrize("bad", [math.nan, -2.0, "big", None])
def test_a_junk_cost_sends_nothing_and_names_the_message(bad: Any) -> None:
    _, producer, consumer = _rig()
    with pytest.raises(CostTableError, match=r"message 3 \(key 'g3'\)"):
        producer.send_job(_job(), cost=lambda m: bad if message_key(m) == "g3" else 1.0)
    assert _received(consumer) == []


def test_bad_arguments_are_refused_before_sending() -> None:
    _, producer, consumer = _rig()
    with pytest.raises(ValueError, match="order must be one of longest_first, arrival"):
        producer.send_job(_job(), cost=lambda m: 1.0, order="shortest")
    with pytest.raises(TypeError, match="sequence of messages"):
        producer.send_job(iter(_job()), cost=lambda m: 1.0)  # type: ignore[arg-type]
    assert _received(consumer) == []
    assert ordered_job([], lambda m: 1.0) == []


def _process_attrs(props: dict[str, Any]) -> dict[str, Any]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = MessageTracer(consumer_group="G", tracer_provider=provider)
    t = tracer.start_message(MessageInfo(topic="T", message_id="m", properties=props))
    with t.handler_scope():
        pass
    t.finish(Outcome.SUCCESS)
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "process T"]
    return dict(span.attributes or {})


@pytest.mark.parametrize(("value", "recorded"), [
    ("longest_first", "longest_first"), ("arrival", "arrival"), ("bogus", None), (b"arrival", "arrival"),
    (b"\xff", None), ([1], None),
])
def test_the_process_span_records_a_known_order_only(value: Any, recorded: str | None) -> None:
    assert _process_attrs({names.JOB_ORDER_PROPERTY: value}).get(names.JOB_ORDER) == recorded


def _with_order(spans: list[SpanRecord], orders: list[str | None]) -> list[SpanRecord]:
    process = [s for s in spans if s.name.startswith("process")]
    for s, o in zip(process, orders):
        if o is not None:
            s.attributes[names.JOB_ORDER] = o
    return spans


@pytest.mark.parametrize(("orders", "said"), [
    (["longest_first"] * 3, "longest_first"), (["arrival"] * 3, "arrival"), ([None] * 3, ""),
    (["longest_first", None, "longest_first"], MIXED_ORDER), (["junk", "junk", "junk"], ""),
])
def test_the_job_view_says_the_order_sent(orders: list[str | None], said: str) -> None:
    records = messages_from_spans(_with_order(scenario_spans(KNOWN), orders))
    assert sent_order(records) == said
    (job,) = report_from_messages(records, 0).groups[0].jobs
    assert job.sent_order == said
    assert job.as_dict()["sent_order"] == said


def test_report_terminal_and_costs_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tracer.tools.cli import main

    spans = tmp_path / "spans.jsonl"
    with spans.open("w") as f:
        for s in _with_order(scenario_spans(KNOWN), ["longest_first"] * 3):
            f.write(json.dumps(dataclasses.asdict(s)) + "\n")
    costs = tmp_path / "costs.json"
    assert main(["report", str(spans), "--costs", str(costs)]) == 0
    out = capsys.readouterr().out
    assert "sent" in out and "longest first" in out
    assert f"costs: 3 keys from 3 handled messages written to {costs}" in out
    table = load_costs(costs)
    # KNOWN: m1 1000 ms, m2 200 ms, m3 100 ms of handler
    assert dict(table.costs) == pytest.approx({"m1": 1.0, "m2": 0.2, "m3": 0.1})
    html = tmp_path / "r.html"
    assert main(["report", str(spans), "--html", str(html)]) == 0
    assert "<td>sent</td><td class='l'>longest first</td>" in html.read_text()
    capsys.readouterr()
    assert main(["report", str(spans), "--costs", str(tmp_path), "--json"]) == 2
    assert "--costs" in capsys.readouterr().err
    assert main(["report", str(spans), "--fleet", "--costs", str(costs)]) == 2


def test_a_message_without_the_order_is_not_mixed_with_stamps_rebuilt() -> None:
    # the path that rebuilds stamps from span times reads the order too
    spans = _with_order(scenario_spans(KNOWN, stamps=False), ["arrival"] * 3)
    records = messages_from_spans(spans)
    assert {r.order for r in records} == {"arrival"}
    assert all(r.stamps.times[Stage.HANDLER_END] for r in records)


def test_the_readme_example_sends_in_the_order_the_readme_says() -> None:
    from tracer.dispatch import learn_costs

    _, producer, consumer = _rig()
    messages = []
    for group in ("tg-1", "tg-2", "tg-3"):
        m = Message()
        m.topic, m.keys, m.body = "T", group, b"{}"
        messages.append(m)
    producer.send_job(messages, cost=learn_costs([("tg-1", 0.04), ("tg-2", 3.9)]), job_id="job-42")
    got = _received(consumer)
    assert [message_key(m) for m in got] == ["tg-2", "tg-3", "tg-1"]
    assert float(got[1].properties[names.COST_PROPERTY]) == 1.97  # unknown: the median
