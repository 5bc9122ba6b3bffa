"""Promise (exportchild.py module doc; issue #35 item 2): every span the in-process OTLP exporter
would send, the export child sends; a span fails only when its exporter says so.

Steps: ChildExportProcessor to a child exporter that records what it exports. End 20 ordinary
spans and, among them, one span with an attribute whose value is an IntEnum member (a str-Enum
member, a float subclass, in an attribute, an event, a link and a resource). The SDK keeps these
values as they are (they are ints, strs, floats), and the in-process OTLP encoder sends them.

Expected: 21 exported, 0 failed, and the child's OTLP of each equals the in-process encoding.
Actual: `marshal` refuses an instance of a subclass of int/str/float ("unmarshallable object"), so
the writer counts the whole batch failed — the one span and the 20 innocent ones beside it.
"""
import enum, os, sys, tempfile
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _rig import child_env, encoded, provider
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import Link, SpanContext, TraceFlags
from tracer.telemetry.exportchild import ChildExportProcessor


class Code(enum.IntEnum):
    OK = 7


class Role(str, enum.Enum):
    CONSUMER = "consumer"


class Seconds(float):
    pass


path = tempfile.mktemp(suffix=".child")
proc = ChildExportProcessor("_rig:recording", {"path": path}, env=child_env(), max_batch_size=512)
seen = []
prov = provider(proc, resource=Resource({"service.name": "review35", "deploy.role": Role.CONSUMER}))
tracer = prov.get_tracer("review35")
for i in range(10):
    with tracer.start_as_current_span(f"ok{i}") as s:
        s.set_attribute("i", i)
        seen.append(s)
link = Link(SpanContext(0xABC, 0xDEF, True, TraceFlags(1)), {"code": Code.OK})
with tracer.start_as_current_span(Role.CONSUMER, links=[link]) as s:  # a str subclass as the span name, too
    s.set_attribute("code", Code.OK)
    s.set_attribute("role", Role.CONSUMER)
    s.set_attribute("took", Seconds(0.25))
    s.set_attribute("codes", (Code.OK, Code.OK))
    s.add_event("e", {"code": Code.OK})
    seen.append(s)
for i in range(10):
    with tracer.start_as_current_span(f"ok{10 + i}") as s:
        seen.append(s)
mine = [encoded(s) for s in seen]  # the in-process encoder takes every one of them
prov.shutdown()
st = proc.statistics()
print(st)
assert st.exported == 21 and st.failed == 0, f"exported {st.exported} of 21, failed {st.failed}"
with open(path) as f:
    child = f.read().split()
assert child == mine, "the child's OTLP differs from the in-process encoding"
