"""Promise (issue #31 item 4, hold.py, README "RmqtraceSpansDropped"): "late spans of traces the keep
policy dropped on purpose" are the policy's drop (rmqtrace_spans_policy_dropped_total), never an
export loss (rmqtrace_spans_dropped_total, which fires RmqtraceSpansDropped with a healthy exporter).

Steps: HoldingSpanProcessor over an in-memory exporter, with on_dropped / on_policy_dropped
counters (what configure_tracing binds to the two Prometheus counters). A held trace (the keep
policy's: hold.open_trace) has a user span that is still open when the policy drops the trace —
e.g. a span the handler hands to a background thread. Then 5000 more traces are decided and
dropped (at 1000 msg/s: ~5 s of an ordinary consumer whose keep policy drops most messages). The
late span ends.

Expected: it counts in on_policy_dropped (a decided drop), on_dropped stays 0.
Actual: the hold remembers only the last 256 dropped traces (_recent) plus 4096 dropped trace ids (_gone, _REMEMBERED); past them
the late span is "forgotten" and counted on_dropped — an export loss with a healthy exporter, the
false RmqtraceSpansDropped item 4 fixed for recent drops.
"""
import sys
sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from tracer.telemetry.hold import HoldingSpanProcessor

lost, policy = [0], [0]
exp = InMemorySpanExporter()
hold = HoldingSpanProcessor([SimpleSpanProcessor(exp)], ticker=False,
                            on_dropped=lambda n: lost.__setitem__(0, lost[0] + n),
                            on_policy_dropped=lambda n: policy.__setitem__(0, policy[0] + n))
provider = TracerProvider()
provider.add_span_processor(hold)
user = provider.get_tracer("user")
ids = RandomIdGenerator()

ctx = hold.open_trace(ids)                                   # the message's held trace
parent = trace.set_span_in_context(trace.NonRecordingSpan(ctx))
late = user.start_span("background-work", context=parent)   # still open at the decision
hold.release(ctx.trace_id, False)                            # the keep policy drops the message
for _ in range(5000):                                        # the consumer goes on dropping
    hold.release(hold.open_trace(ids).trace_id, False)
late.end()
print("on_dropped (export loss):", lost[0], " on_policy_dropped:", policy[0], hold.statistics().dropped_by_reason)
assert lost[0] == 0, "a late span of a trace the policy dropped was counted as an export loss (rmqtrace_spans_dropped)"
