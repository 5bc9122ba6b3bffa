"""Promise (semconv.md: the send span "is handed to on_end once when the send ends"; every send is
a messaging.client.operation.duration point with error.type on failure; a consumer's process span
is a child of the send span, so the send span must be exported).

Steps: TracedProducer over a producer whose send_async returns a pending
concurrent.futures.Future (as the 5.x client's does). The caller gives up on it — fut.cancel(),
which is what asyncio.wait_for(asyncio.wrap_future(fut), t) does on timeout.

Expected: the send span ends (status ERROR, error.type CancelledError) and the duration is recorded.
Actual: the done-callback calls f.exception(), which raises CancelledError on a cancelled future;
concurrent.futures logs "exception calling callback" and the span is never ended: no span, no
duration point. The message may still reach the broker (the request was already sent), and its
consumer spans then name a parent that was never exported.
"""
import sys
sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
from concurrent.futures import Future
from _rig import Rig
from tracer.clients.producer import TracedProducer
from tracer.embedded import Message
from tracer.telemetry.tracer import MessageTracer

rig = Rig()

class PendingProducer:
    def send_async(self, message):
        return Future()          # the client's future, resolved later by its callback thread

prod = TracedProducer(PendingProducer(), MessageTracer(tracer_provider=rig.provider))
m = Message(); m.topic = "t"; m.body = b"x"
fut = prod.send_async(m)
assert fut.cancel()
sends = rig.spans("send")
print("send spans exported:", len(sends))
assert len(sends) == 1, "a cancelled send_async never ends its send span"
