"""Promise (issue #31 item 12): "Lead with absolute avoidable seconds (total and per message); give
a share only when the total is material; never two verdicts that contradict." The group report
does this (tracer.report.blame: Blame.material, 0.1 s in all and 5 ms per message).

Steps: a spans file (the JSON-lines format rmqtrace writes) with one job on two instances
(services "a" and "b", one worker each). On "a" message m2 is pulled while m1 runs and starts
4 ms after it was pulled; "b" is idle meanwhile. So the job's whole consumer_wait is ~4 ms,
all of it avoidable in the fleet. `rmqtrace report --fleet spans.jsonl`.

Expected: the fleet job line leads with the avoidable seconds (~0.002 s beyond the 2 ms grace) and gives no share (the
total is not material), like the group report.
Actual: the fleet job line says "100% of consumer_wait avoidable in the fleet (100% while another
instance had a free worker)" — a share of an almost empty total, the #12 headline, in the fleet view.
"""
import json, os, subprocess, sys, tempfile

MS = 1_000_000
T0 = 1_790_000_000_000 * MS // 1000 * 1000
def span(i, service, produce, pull, enq, start, end, worker):
    attrs = {"messaging.system": "rocketmq", "messaging.operation.type": "process", "messaging.destination.name": "t",
             "messaging.consumer.group.name": "g", "messaging.message.id": f"m{i}", "rmqtrace.job.id": "job-1",
             "rmqtrace.worker": worker, "rmqtrace.outcome": "success",
             "rmqtrace.stamp.produce_ns": T0 + produce, "rmqtrace.stamp.broker_store_ns": T0 + produce + MS,
             "rmqtrace.stamp.client_pull_ns": T0 + pull, "rmqtrace.stamp.dispatch_enqueue_ns": T0 + enq,
             "rmqtrace.stamp.handler_start_ns": T0 + start, "rmqtrace.stamp.handler_end_ns": T0 + end}
    return {"trace_id": f"{i:032x}", "span_id": f"{i:016x}", "parent_span_id": None, "name": "process t",
            "kind": "CONSUMER", "start_ns": T0 + produce + MS, "end_ns": T0 + end, "status": "UNSET",
            "service": service, "attributes": attrs}
rows = [span(1, "a", 0, 2 * MS, 2 * MS, 2 * MS, 100 * MS, 0),
        span(2, "a", 90 * MS, 96 * MS, 96 * MS, 100 * MS, 150 * MS, 0),
        span(3, "b", 0, 2 * MS, 2 * MS, 2 * MS, 60 * MS, 0)]
path = os.path.join(tempfile.mkdtemp(), "spans.jsonl")
with open(path, "w") as fh:
    for r in rows:
        fh.write(json.dumps(r) + "\n")
out = subprocess.run([sys.executable, "-m", "tracer", "report", "--fleet", path], capture_output=True, text=True)
text = out.stdout + out.stderr
print(text[:1500])
job_lines = [l for l in text.splitlines() if "avoidable" in l and "consumer_wait" in l]
assert not any("%" in l for l in job_lines), "the fleet view gives a share of a ~4 ms consumer_wait: " + " | ".join(job_lines)
