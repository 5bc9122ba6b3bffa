"""Promise (exportchild.py module doc, docs/settings.md; issue #35 item 2): "a clean shutdown
flushes" — shutdown writes what is queued and lets the child export it.

Steps: a process in its own process group (what a terminal's foreground job is) with a SIGINT
handler that asks for a graceful stop (as ConsumeLoop.install_signal_handlers does);
ChildExportProcessor to a child exporter that takes 0.3 s a batch; end 20 spans; once some are
written to the child, Ctrl-C (SIGINT to the process group); the process then shuts the provider
down cleanly. The same happens under systemd (SIGTERM to every process of the unit's cgroup).

Expected: the graceful stop exports all 20 spans (exported=20, lost=0).
Actual: the child gets the terminal's SIGINT too and dies of KeyboardInterrupt; the spans written
to it are counted lost and the clean shutdown flushes nothing it had.
"""
import os, signal, subprocess, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if os.environ.get("REVIEW35_IN_GROUP") != "1":  # the Ctrl-C must not reach whoever runs this script
    done = subprocess.run([sys.executable, os.path.abspath(__file__)], env={**os.environ, "REVIEW35_IN_GROUP": "1"},
                          start_new_session=True, timeout=60)
    sys.exit(done.returncode)
import tempfile
from _rig import child_env, provider
from tracer.telemetry.exportchild import ChildExportProcessor

stop = []
signal.signal(signal.SIGINT, lambda *_: stop.append(1))
proc = ChildExportProcessor("_rig:recording", {"path": tempfile.mktemp(), "delay_s": 0.3}, env=child_env(),
                            max_batch_size=5)
prov = provider(proc)
tracer = prov.get_tracer("review35")
for i in range(20):
    with tracer.start_as_current_span(f"s{i}"):
        pass
while proc.statistics().unacknowledged == 0:  # a poll: the writer hands the first batch over
    time.sleep(0.01)  # real-time: the poll's interval (a statistics() condition)
os.killpg(os.getpgid(0), signal.SIGINT)
while not stop:
    time.sleep(0.01)  # real-time: the poll's interval (the SIGINT handler's flag)
prov.shutdown()
st = proc.statistics()
print(st)
assert st.exported == 20 and st.lost == 0, f"a clean shutdown after Ctrl-C lost {st.lost} of 20 spans"
