"""Promise (report/costs.py): the table is keyed by "the message's first key — what
tracer.dispatch.cost.message_key reads on the producer". message_key of a 5.x message (keys a set)
is the smallest key.

Steps: a rocketmq 5.x Message with keys {"k-01" .. "k-12"} goes through the consumer's tracing
(describe, start_message, finish); the learner reads the process span's first recorded key. Run
under several PYTHONHASHSEED values (str hashing is randomized per process).

Expected: the recorded first key is message_key(msg) ("k-01") in every process.
Actual: the keys are recorded in the set's iteration order, which depends on the process's hash
seed: the table learns whichever key came first, the producer looks up the smallest.
"""
import os
import subprocess
import sys

CHILD = """
import rocketmq
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tracer.dispatch.cost import message_key
from tracer.path.message import describe
from tracer.path.stages import Outcome
from tracer.telemetry.tracer import MessageTracer
exp = InMemorySpanExporter(); tp = TracerProvider(); tp.add_span_processor(SimpleSpanProcessor(exp))
m = rocketmq.Message(); m.topic = "t"; m.body = b"x"
for i in range(12, 0, -1): m.keys = f"k-{i:02d}"
tr = MessageTracer(tracer_provider=tp, consumer_group="g")
t = tr.start_message(describe(m))
with t.handler_scope():
    pass
t.finish(Outcome.SUCCESS)
tp.force_flush()
keys = [s.attributes["messaging.rocketmq.message.keys"] for s in exp.get_finished_spans() if s.name.startswith("process")]
assert keys, [s.name for s in exp.get_finished_spans()]
keys = keys[0]
print(keys[0], message_key(m))
"""
bad = []
for seed in range(8):
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONHASHSEED": str(seed)})
    assert out.returncode == 0, out.stderr
    first, key = out.stdout.split()
    if first != key:
        bad.append((seed, first, key))
print(bad)
assert not bad, f"recorded first key != message_key in {len(bad)} of 8 hash seeds: {bad[:3]}"
