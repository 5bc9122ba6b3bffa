"""Promise (docs/report.md): "Lower bound (LB): max(total handler time / workers, longest handler
time). No schedule on that many workers finishes sooner"; "Workers: the number of distinct
rmqtrace.worker values"; occupancy = busy share of the workers. A report must never show a job
finishing faster than its lower bound or workers busy more than 100 % of the time.

Steps: the ordinary production shape — one consumer group run by two consumer processes
(instances "a" and "b", one worker each, so both stamp rmqtrace.worker=0), read from one spans file
(or from Jaeger: `rmqtrace report --jaeger`, the same model). Three messages of one job; the two
instances' handlers overlap. `rmqtrace report spans.jsonl --json`.

Expected: 2 workers (one per instance; the fleet view, from the same spans, counts 1 + 1), a lower
bound the completion respects (over_lb >= 1), occupancy <= 100 %.
Actual: workers = 1 (worker 0 of a and worker 0 of b are one lane), lower bound 0.206 s for a job
completed in 0.15 s ("took 0.73x the lower bound"), "workers busy 137% of the time". The group
model has no notion of instance, so in any multi-instance group every worker-derived figure
(LB, x LB, occupancy, the per-worker lanes the blame and critical path are read from) is false.
"""
import json, os, subprocess, sys, tempfile

MS = 1_000_000
T0 = 1_790_000_000_000_000_000
def span(i, service, produce, pull, start, end, worker):
    attrs = {"messaging.system": "rocketmq", "messaging.operation.type": "process", "messaging.destination.name": "t",
             "messaging.consumer.group.name": "g", "messaging.message.id": f"m{i}", "rmqtrace.job.id": "job-1",
             "rmqtrace.worker": worker, "rmqtrace.outcome": "success",
             "rmqtrace.stamp.produce_ns": T0 + produce, "rmqtrace.stamp.broker_store_ns": T0 + produce + MS,
             "rmqtrace.stamp.client_pull_ns": T0 + pull, "rmqtrace.stamp.dispatch_enqueue_ns": T0 + pull,
             "rmqtrace.stamp.handler_start_ns": T0 + start, "rmqtrace.stamp.handler_end_ns": T0 + end}
    return {"trace_id": f"{i:032x}", "span_id": f"{i:016x}", "parent_span_id": None, "name": "process t",
            "kind": "CONSUMER", "start_ns": T0 + produce + MS, "end_ns": T0 + end, "status": "UNSET",
            "service": service, "attributes": attrs}
rows = [span(1, "a", 0, 2 * MS, 2 * MS, 100 * MS, 0),
        span(2, "a", 90 * MS, 96 * MS, 100 * MS, 150 * MS, 0),
        span(3, "b", 0, 2 * MS, 2 * MS, 60 * MS, 0)]
path = os.path.join(tempfile.mkdtemp(), "spans.jsonl")
with open(path, "w") as fh:
    for r in rows:
        fh.write(json.dumps(r) + "\n")
out = subprocess.run([sys.executable, "-m", "tracer", "report", path, "--json"], capture_output=True, text=True)
job = json.loads(out.stdout)["groups"][0]["jobs"][0]
print({k: job[k] for k in ("workers", "completion_s", "lower_bound_s", "over_lb", "occupancy")})
assert job["over_lb"] >= 1.0 and job["occupancy"] <= 1.0, \
    f"job completed at {job['over_lb']:.2f}x its 'lower bound' with workers {job['occupancy']:.0%} busy"
