"""Promise (exportchild.py module doc, docs/settings.md; issue #35 item 2): "the child restarted if
it dies, with the loss counted and logged" — the export keeps going when the child fails.

Steps: ChildExportProcessor to a child exporter that succeeds at once, OTEL_EXPORTER_OTLP_TIMEOUT=1
(the longest one export may take); end spans; SIGSTOP the child (a child wedged for good looks the
same: a hung exporter, a debugger, the OOM killer's freeze); keep ending spans, a few a 10 ms, for
up to 60 s.

Expected: a child that has not answered for several of its exporter's timeouts is treated as dead:
stopped, its unacknowledged spans counted lost, another started, and the spans ended afterwards
are exported again.
Actual: nothing looks at a silent child: the writer blocks for ever writing to the full pipe, the
queue fills and every span from then on is dropped until shutdown; force_flush just times out.
"""
import os, signal, sys, tempfile, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _rig import child_env, provider
from tracer.telemetry.exportchild import ChildExportProcessor

os.environ["OTEL_EXPORTER_OTLP_TIMEOUT"] = "1"
path = tempfile.mktemp()
proc = ChildExportProcessor("_rig:recording", {"path": path}, env=child_env(), max_queue_size=256,
                            max_batch_size=64, restart_delay_s=0.1)
prov = provider(proc)
tracer = prov.get_tracer("review35")
pad = "p" * 2000  # a few spans fill the pipe
for i in range(10):
    with tracer.start_as_current_span("before") as s:
        s.set_attribute("pad", pad)
assert proc.force_flush(30_000)
stopped = proc.child_pid
os.kill(stopped, signal.SIGSTOP)
exported_before = proc.statistics().exported
try:
    for _ in range(6000):  # 60 s of 5 spans each 10 ms
        for _ in range(5):
            with tracer.start_as_current_span("after") as s:
                s.set_attribute("pad", pad)
        time.sleep(0.01)  # real-time: spans keep coming at a rate while the child is stopped
        st = proc.statistics()
        if st.restarts and st.exported > exported_before:
            break
finally:
    try:  # still the stopped one: let the shutdown below count it
        os.kill(stopped, signal.SIGKILL)
    except ProcessLookupError:
        pass  # replaced (killed and reaped) already
proc.shutdown(timeout_millis=5000)
st = proc.statistics()
print(st)
assert st.restarts >= 1 and st.exported > exported_before, (
    f"a stopped child is never replaced: {st.dropped} spans dropped after it stopped, none exported")
