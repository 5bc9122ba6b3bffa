"""Promise (common quality bar, "Loud early errors for arguments that cannot work"; ChildExportProcessor
checks its other arguments at construction: a factory without ':' is refused there).

Steps: ChildExportProcessor("no_such_module_review35:exporters") and
ChildExportProcessor("tracer.config:no_such_function"); end 5 spans on each and shut down.

Expected: a ValueError at construction naming the factory, as for a factory without ':'.
Actual: both are accepted; every child dies at start with an ImportError/AttributeError traceback,
every span is counted lost, and a running process logs a death a second for ever.
"""
import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _rig import provider
from tracer.telemetry.exportchild import ChildExportProcessor

accepted = []
for factory in ("no_such_module_review35:exporters", "tracer.config:no_such_function", "tracer.config:Settings.x"):
    try:
        proc = ChildExportProcessor(factory)
    except ValueError as exc:
        print("refused:", exc)
        continue
    prov = provider(proc)
    for _ in range(5):
        with prov.get_tracer("review35").start_as_current_span("s"):
            pass
    prov.shutdown()
    accepted.append((factory, proc.statistics()))
print(accepted)
assert not accepted, f"factories that cannot work were accepted: {accepted}"
