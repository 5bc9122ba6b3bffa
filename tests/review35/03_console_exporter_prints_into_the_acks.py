"""Promise (docs/settings.md RMQTRACE_EXPORT_CHILD: "the exporters OTEL_TRACES_EXPORTER names run in a
child process"; config.py: OTEL_TRACES_EXPORTER=console is supported; exportchild.child_main: "an
exporter that prints (console) must not write into the acknowledgements").

Steps: in a fresh process, ChildExportProcessor(factory_args={"traces_exporter": "console"}) (what
configure_tracing builds for OTEL_TRACES_EXPORTER=console RMQTRACE_EXPORT_CHILD=true); end one
span named "hello-console"; shut the provider down. Read that process's stdout and stderr.

Expected: the span's JSON is printed where the in-process console exporter prints it (stdout).
Actual: nothing is printed anywhere, yet the span counts as exported: ConsoleSpanExporter's
`out=sys.stdout` default is bound when the SDK module is imported — before child_main swaps
sys.stdout — so the JSON goes into the acknowledgement pipe, where the parent's reader discards
every line that is not "seq exported failed". Anything in the child that writes to fd 1 does too.
"""
import os, subprocess, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _rig import ROOT

program = """
import sys
from opentelemetry.sdk.trace import TracerProvider
from tracer.telemetry.exportchild import ChildExportProcessor
p = ChildExportProcessor(factory_args={"traces_exporter": "console"})
prov = TracerProvider(); prov.add_span_processor(p)
with prov.get_tracer("x").start_as_current_span("hello-console"):
    pass
prov.shutdown()
print("stats", p.statistics(), file=sys.stderr)
"""
done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60,
                      env={**os.environ, "PYTHONPATH": ROOT})
print(done.stderr[-600:])
assert "exported=1" in done.stderr, "the span was not even counted exported"
assert "hello-console" in done.stdout, ("the console exporter's span is counted exported but printed nowhere "
                                        f"(stdout {len(done.stdout)} chars)")
