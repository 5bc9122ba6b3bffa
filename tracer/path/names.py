"""Every name that leaves the process: span names, span attributes, message properties.

Telemetry writes these, propagation reads and writes the properties, and the report reads the
attributes back from span files; all of them import the names from here, so a rename is one
edit. ``messaging.*``, ``server.*`` and ``error.type`` are OpenTelemetry's (messaging semantic
conventions with the RocketMQ extension, schema :data:`SCHEMA_URL`); ``rmqtrace.*`` and the
``rmqtrace_*`` properties are ours. docs/semconv.md lists them with their requirement levels.

The gap spans are derived from :data:`tracer.path.stages.PATH_GAPS`, not listed by hand.
"""

from __future__ import annotations

from typing import Final

from .stages import GAPS, PATH_GAPS, Gap, Stage

__all__ = [
    "BODY", "BODY_SIZE", "CLIENT_ID", "GAP_ATTRS", "TRACE_SHAPES", "CONSUMER_GROUP", "DELIVERY_TIMESTAMP",
    "COST", "COST_PROPERTY", "DELIVERY_ATTEMPT", "DESTINATION", "ERROR_TYPE", "GAP_SPANS",
    "HANDLER_SPAN", "JOB_ID", "JOB_ID_PROPERTY", "JOB_ORDER", "JOB_ORDERS", "JOB_ORDER_PROPERTY", "PRIORITY_PROPERTY",
    "LEGACY_DELIVERY_ATTEMPT", "MESSAGE_GROUP",
    "MESSAGE_ID", "MESSAGE_KEYS", "MESSAGE_TAG", "MESSAGE_TYPE", "NAMESPACE", "OPERATION_NAME",
    "OPERATION_TYPE", "OUTCOME", "PROBE_PROPERTY", "PROBE_VALUE",
    "PROCESS", "PRODUCE_NS_PROPERTY", "SCHEMA_URL", "SEND", "SERVER_ADDRESS",
    "SERVER_PORT", "STAGE", "STAMP_ATTRS", "SYSTEM", "SYSTEM_VALUE", "TRACEPARENT", "TRACESTATE",
    "WORKER", "process_span_name", "send_span_name",
    # live blame (tracer.path.blocking), on the wait span
    "BLAME_AVOIDABLE_WAIT", "DISPATCH_POLICY", "BLAME_BLOCKER_MESSAGE_ID", "BLAME_REASON", "BLAME_SPAN",
    # client operations of a pull consumer (tracer.telemetry.operations)
    "ACK", "BATCH_MESSAGE_COUNT", "CHANGE_INVISIBLE_DURATION", "RECEIVE", "SETTLE", "operation_span_name",
]

# The semantic-conventions release whose names we emit (the RocketMQ attributes still live under
# ``messaging.rocketmq.*`` there); set as the instrumentation scope's schema_url.
SCHEMA_URL = "https://opentelemetry.io/schemas/1.44.0"

# -- span names and operations ----------------------------------------------------------------
SEND = "send"
PROCESS = "process"
HANDLER_SPAN = "handler"


def send_span_name(topic: str) -> str:
    return f"{SEND} {topic}"


def process_span_name(topic: str) -> str:
    return f"{PROCESS} {topic}"


# A pull consumer's other operations: ``messaging.operation.type`` receive / settle, and the
# client's own operation names (``messaging.operation.name``) for its two settle calls.
RECEIVE = "receive"
SETTLE = "settle"
ACK = "ack"
CHANGE_INVISIBLE_DURATION = "change_invisible_duration"


def operation_span_name(operation: str, topic: str | None) -> str:
    """``{messaging.operation.name} {destination}``, the destination omitted when unknown."""
    return f"{operation} {topic}" if topic else operation


# -- OpenTelemetry semantic-convention attributes ------------------------------------------------
SYSTEM = "messaging.system"
SYSTEM_VALUE = "rocketmq"
OPERATION_NAME = "messaging.operation.name"
OPERATION_TYPE = "messaging.operation.type"
DESTINATION = "messaging.destination.name"
CONSUMER_GROUP = "messaging.consumer.group.name"
CLIENT_ID = "messaging.client.id"
BATCH_MESSAGE_COUNT = "messaging.batch.message_count"  # receive: how many messages the call returned
MESSAGE_ID = "messaging.message.id"
BODY_SIZE = "messaging.message.body.size"  # opt-in in the spec
NAMESPACE = "messaging.rocketmq.namespace"
MESSAGE_TAG = "messaging.rocketmq.message.tag"
MESSAGE_KEYS = "messaging.rocketmq.message.keys"
MESSAGE_GROUP = "messaging.rocketmq.message.group"
MESSAGE_TYPE = "messaging.rocketmq.message.type"  # normal, fifo, delay, transaction
DELIVERY_TIMESTAMP = "messaging.rocketmq.message.delivery_timestamp"  # ms, a delay message's due time
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
ERROR_TYPE = "error.type"

# -- ours ---------------------------------------------------------------------------------------
OUTCOME = "rmqtrace.outcome"
JOB_ID = "rmqtrace.job.id"
COST = "rmqtrace.cost"
# The order a job was sent in (send_job): on the consumer's process span, from JOB_ORDER_PROPERTY
JOB_ORDER = "rmqtrace.job.order"
JOB_ORDERS: tuple[str, ...] = ("longest_first", "arrival")  # arrival: the order send_job was given
WORKER = "rmqtrace.worker"
STAGE = "rmqtrace.stage"  # on a gap span: which gap it is
BODY = "rmqtrace.message.body"  # opt-in body preview
# The broker's delivery attempt. Not under messaging.rocketmq.*: that namespace is OpenTelemetry's
# and defines no such attribute. Span files written before the move carry the old name.
DELIVERY_ATTEMPT = "rmqtrace.delivery_attempt"
LEGACY_DELIVERY_ATTEMPT = "messaging.rocketmq.message.delivery_attempt"
STAMP_ATTRS: dict[Stage, str] = {s: f"rmqtrace.stamp.{s.name.lower()}_ns" for s in Stage}
# The compact trace (MessageTracer(trace_shape="compact")): every gap on `process`, in seconds.
GAP_ATTRS: dict[str, str] = {g.name: f"rmqtrace.gap.{g.name}_s" for g in GAPS}
TRACE_SHAPES: tuple[str, ...] = ("full", "compact")  # RMQTRACE_TRACE_SHAPE

# Live blame (tracer.path.blocking): why a message waited in the dispatcher, on its wait span
# (BLAME_SPAN in the full shape, ``process`` in the compact one), with a span link to the
# blocker's handler span.
BLAME_REASON = "rmqtrace.blame.reason"  # head_of_line, capacity, none
BLAME_AVOIDABLE_WAIT = "rmqtrace.blame.avoidable_wait"  # s: the part of the wait some worker was idle
BLAME_BLOCKER_MESSAGE_ID = "rmqtrace.blame.blocker.message.id"  # the message that ran on its worker
BLAME_SPAN = "dispatch_wait"  # the gap span that covers the wait the dispatcher can blame
DISPATCH_POLICY = "rmqtrace.dispatch.policy"  # on the OTel avoidable-wait counter: the dispatcher's policy

# A consume loop's lease that ended while the loop still held the message (tracer.clients.lease):
# the broker may hand it out again, so the message can run twice. On the ``process`` span of the
# run whose lease ended; the redelivery seen by the same tracer links back to that run.
LEASE_LOST = "rmqtrace.lease.lost"  # why: expired (ran out before renewal), abandoned (hung handler)
LEASE_LOST_REASONS: tuple[str, ...] = ("expired", "abandoned")
ABANDONED = "rmqtrace.abandoned"  # on a timed-out handler's span ended before the handler returned
LINK_REASON = "rmqtrace.link.reason"  # on a span link of ours that is not the creation link
LINK_LEASE_LOST = "lease_lost"  # the redelivery's link to the run whose lease was lost

# -- message properties (what travels) -----------------------------------------------------------
# W3C keys, as the OpenTelemetry Java agent's RocketMQ instrumentation writes them.
# Final: the compiled message path (tracer.compiled) inlines them
TRACEPARENT: Final = "traceparent"
TRACESTATE: Final = "tracestate"
PRODUCE_NS_PROPERTY = "rmqtrace_produce_ns"
JOB_ID_PROPERTY = "rmqtrace_job"
COST_PROPERTY = "rmqtrace_cost"
JOB_ORDER_PROPERTY = "rmqtrace_order"  # one of JOB_ORDERS; anything else is not recorded
# the broker's own property for a message's priority (MessageConst.PROPERTY_PRIORITY): the 2.x client has
# no field for it; the 5.x client sends Message.priority as a system property instead
PRIORITY_PROPERTY = "_SYS_MSG_PRIORITY_"
# Marks a probe (tracer.clients.probe): consumers settle it without running the handler. Only
# PROBE_VALUE, what the probe sender writes, marks one: a user message that happens to carry the
# property with another value ("false", "0") is the user's and must run.
PROBE_PROPERTY = "rmqtrace_probe"
PROBE_VALUE = "1"

# -- gap spans ----------------------------------------------------------------------------------
# The path gaps written as child spans of ``process``: every gap from the broker's store to the
# handler's start (``send`` is the producer's own span, ``handler`` a live span, and aggregates
# such as consumer_wait are not in PATH_GAPS). broker_wait ends where ``process`` starts.
GAP_SPANS: tuple[Gap, ...] = tuple(
    g for g in PATH_GAPS if g.start >= Stage.BROKER_STORE and g.end <= Stage.HANDLER_START)
