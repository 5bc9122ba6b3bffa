"""Promise (send_job docstring): each message is sent "with job_id, its cost and the order"; loud
early errors for arguments that cannot work.

Steps: send_job(messages, cost=..., job_id=5) and job_id="" on a traced producer.

Expected: TypeError / ValueError before anything is sent (a job id is a non-empty str).
Actual: every message is sent without its job id (job_id=5: the property is refused and the send
goes on, one log line; job_id="": dropped as falsy) — the report cannot group the job.
"""
from tracer.clients.producer import TracedProducer
from tracer.embedded import EmbeddedBroker, Message, Producer
from tracer.telemetry.tracer import MessageTracer

broker = EmbeddedBroker()
real = Producer(broker, ["t"])
real.startup()
tp = TracedProducer(real, MessageTracer())
for junk in (5, "", b"job"):
    m = Message()
    m.topic, m.body, m.keys = "t", b"x", "a"
    try:
        tp.send_job([m], cost=lambda _m: 1.0, job_id=junk)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        print("refused:", exc)
        continue
    raise SystemExit(f"job_id={junk!r}: sent, properties {m.properties}")
