"""Promise (issue #34 fault class "a producer failure halfway through a job (what was sent is
said? the rest?)"; send_job docstring: "the messages before it were sent").

Steps: TracedProducer over a producer whose third send raises ConnectionError; send_job of five
messages (costs 0..4, sent longest first).

Expected: the error says which messages were sent (with their receipts), which one failed and which
were not tried — the caller can resend exactly the rest; the send's own error is its __cause__.
Actual: the bare ConnectionError: the receipts of the two sent messages are lost, and which two
went is decided by a sort the caller never saw.
"""
from tracer.clients.producer import TracedProducer
from tracer.embedded import EmbeddedBroker, Message, Producer
from tracer.telemetry.tracer import MessageTracer

broker = EmbeddedBroker()
real = Producer(broker, ["t"])
real.startup()


class Flaky:
    calls = 0

    def send(self, m):
        Flaky.calls += 1
        if Flaky.calls == 3:
            raise ConnectionError("broker went away")
        return real.send(m)


def msg(i):
    m = Message()
    m.topic, m.body, m.keys = "t", b"x", f"k{i}"
    return m


ms = [msg(i) for i in range(5)]
tp = TracedProducer(Flaky(), MessageTracer())
try:
    tp.send_job(ms, cost=lambda m: float(m.keys[0][1:]), job_id="j")
except Exception as exc:  # noqa: BLE001
    print(type(exc).__name__, exc)
    sent, failed, unsent = getattr(exc, "sent", None), getattr(exc, "failed", None), getattr(exc, "unsent", None)
    assert sent is not None and failed is not None and unsent is not None, "the error does not say what was sent"
    assert [m for m, _ in sent] == [ms[4], ms[3]] and all(r.message_id for _, r in sent), sent
    assert failed is ms[2] and list(unsent) == [ms[1], ms[0]], (failed, unsent)
    assert isinstance(exc.__cause__, ConnectionError)
else:
    raise SystemExit("no error")
