"""Process spans written by hand in the span-file format `rmqtrace report` reads, and the CLI run."""
import json, os, subprocess, sys


def span(i, keys, handler_s, outcome="success"):
    t0 = 1790000000000000000 + i * 10**9
    hs = t0 + 2_000_000
    he = hs + int(handler_s * 1e9)
    a = {"messaging.system": "rocketmq", "messaging.operation.type": "process", "messaging.destination.name": "t",
         "messaging.consumer.group.name": "g", "messaging.message.id": f"m{i}", "rmqtrace.job.id": "job-1",
         "rmqtrace.worker": 0, "rmqtrace.outcome": outcome,
         "rmqtrace.stamp.produce_ns": t0, "rmqtrace.stamp.broker_store_ns": t0 + 1_000_000,
         "rmqtrace.stamp.client_pull_ns": hs, "rmqtrace.stamp.dispatch_enqueue_ns": hs,
         "rmqtrace.stamp.handler_start_ns": hs, "rmqtrace.stamp.handler_end_ns": he}
    if keys is not None:
        a["messaging.rocketmq.message.keys"] = keys
    return {"trace_id": f"{i + 1:032x}", "span_id": f"{i + 1:016x}", "parent_span_id": None, "name": "process t",
            "kind": "CONSUMER", "start_ns": t0 + 1_000_000, "end_ns": he, "status": "UNSET", "service": "a",
            "attributes": a}


def write(path, spans):
    with open(path, "w") as f:
        for s in spans:
            f.write(json.dumps(s) + "\n")


def report(*args, timeout=60):
    env = {**os.environ}
    return subprocess.run([sys.executable, "-m", "tracer", "report", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)
