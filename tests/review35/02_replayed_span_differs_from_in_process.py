"""Promise (tracer/telemetry/spanwire.py, exportchild.py module doc; issue #35 item 2): the export
child rebuilds each span as a ReadableSpan "an exporter reads the same, dropped counts included",
so what the child's OTLP exporter sends is what the in-process exporter would have sent.

Steps: a TracerProvider with SpanLimits (few attributes per event and per link, so some are
dropped), a resource with a schema URL, a scope with a version, schema URL and attributes; one span
per case: attributes of every type the SDK allows (str, bool, int, float, bytes, None, tuples,
nested mappings), a 1 MiB string, 300 attributes, events and links carrying more attributes than the
limit, a trace state, a remote parent, an ERROR status with a description, every span kind. The
spans go through ChildExportProcessor to a child exporter that writes the OTLP encoding of every
span it exports; the same spans are encoded in this process as the in-process exporter would.

Expected: the child's encoding of every span equals the in-process one, byte for byte.
Actual: events and links lose their dropped_attributes_count (span_from_record discards the counts
span_record carried), so a span whose event or link dropped attributes reads 0 dropped at the
backend: the child's OTLP differs from the in-process one.
"""
import os, sys, tempfile
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _rig import child_env, encoded, provider
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState
from tracer.telemetry.exportchild import ChildExportProcessor

path = tempfile.mktemp(suffix=".child")
proc = ChildExportProcessor("_rig:recording", {"path": path}, env=child_env())
originals = []


class Keep(ChildExportProcessor.__mro__[1]):  # a plain SpanProcessor: what the in-process exporter sees
    def on_start(self, span, parent_context=None): pass
    def on_end(self, span): originals.append(span)
    def shutdown(self): pass
    def force_flush(self, timeout_millis=30000): return True


prov = provider(Keep(), resource=Resource({"service.name": "review35", "service.instance.id": "h:1"},
                                          "https://opentelemetry.io/schemas/1.21.0"),
                span_limits=SpanLimits(max_event_attributes=2, max_link_attributes=2, max_span_attributes=400))
prov.add_span_processor(proc)
tracer = prov.get_tracer("review35.scope", "1.2.3", schema_url="https://example.com/s",
                         attributes={"scope.attr": "v"})
every_type = {"s": "x", "b": True, "i": -7, "big": 2**62, "f": 1.5, "bytes": b"\x00\xff", "none": None,
              "ts": ("a", "b"), "ti": (1, 2), "tf": (0.5,), "tb": (True, False), "empty": (),
              "map": {"k": "v", "n": {"deep": 1}}, "unicode": "žluťoučký 🐇"}
remote = SpanContext(0x1234, 0x5678, True, TraceFlags(1), TraceState([("vendor", "value")]))
link_ctx = SpanContext(0xABC, 0xDEF, True, TraceFlags(1), TraceState([("k", "v")]))
many = {f"a{i}": i for i in range(300)}
cases = {
    "every_type": dict(attributes=every_type),
    "huge_string": dict(attributes={"huge": "y" * (1 << 20)}),
    "many_attributes": dict(attributes=many),
    "remote_parent": dict(context=trace.set_span_in_context(trace.NonRecordingSpan(remote)), kind=SpanKind.CONSUMER),
    "links": dict(links=[Link(link_ctx, {"l1": 1, "l2": 2, "l3": 3, "l4": 4}), Link(link_ctx)], kind=SpanKind.PRODUCER),
}
for name, kw in cases.items():
    with tracer.start_as_current_span(name, **kw) as span:
        pass
with tracer.start_as_current_span("events", kind=SpanKind.SERVER) as span:
    span.add_event("e1", {"e1": 1, "e2": 2, "e3": 3, "e4": "four"}, timestamp=123)
    span.add_event("e2", every_type)
    span.add_event("plain")
with tracer.start_as_current_span("error", kind=SpanKind.CLIENT) as span:
    span.set_status(Status(StatusCode.ERROR, "it broke"))
    span.record_exception(ValueError("boom"))
prov.shutdown()
st = proc.statistics()
print(st)
with open(path) as f:
    child = f.read().split()
assert len(child) == len(originals), f"the child exported {len(child)} of {len(originals)} spans"
mine = [encoded(s) for s in originals]
diff = [s.name for s, a, b in zip(originals, mine, child) if a != b]
print("spans whose OTLP differs from the in-process encoding:", diff)
assert not diff, f"{len(diff)} span(s) reach the backend different from the in-process exporter's: {diff}"
