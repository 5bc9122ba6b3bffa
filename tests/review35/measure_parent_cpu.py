"""Not a finding: the parent's CPU a span through the export child (span creation included), to
compare two trees: PYTHONPATH=<tree> python tests/review35/measure_parent_cpu.py (run from anywhere)."""
import os, sys, time
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from tracer.telemetry.exportchild import ChildExportProcessor
env = dict(os.environ); env["PYTHONPATH"] = os.pathsep.join([HERE, env.get("PYTHONPATH", "")])
p = ChildExportProcessor("_rig:null", env=env, max_queue_size=1 << 16)
prov = TracerProvider(); prov.add_span_processor(p)
t = prov.get_tracer("x")
def run(n):
    for i in range(n):
        with t.start_as_current_span("s") as s:
            s.set_attribute("i", i); s.set_attribute("k", "v")
    p.force_flush(60000)
run(2000)
c0 = time.process_time()
run(40000)
c1 = time.process_time()
st = p.statistics()
prov.shutdown()
print(f"{(c1 - c0) / 40000 * 1e6:.2f} us/span cpu (parent, incl. span creation)", st.dropped)
