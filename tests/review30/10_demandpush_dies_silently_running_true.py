"""10 — DemandPushConsumer: once its loop's run() ends by itself (here: one retry_backoff= call that
raises an ordinary Exception, finding 01; equally a LeaseRefused or a Ctrl-C raised in key=/cost=),
the consumer stops consuming for good while `running` stays True; nothing but one log line says so,
and later messages pile up unconsumed.

Promises broken: the module docstring's drop-in lifecycle ("same startup()/shutdown()"; it runs
until shutdown()); user callables failing are contained; `running` reflects whether it consumes.
Steps: DemandPushConsumer on the embedded broker; the listener fails the first message (returns a
non-SUCCESS); retry_backoff raises ValueError; 5 more messages are sent after 1 s.
Expected: the later messages are consumed (the error contained), or at least `running` is False.
Actual: running == True, the later messages are never consumed.
Real time: ~4 s.
"""
import time, logging, enum
from _common import *
from tracer.clients.demandpush import DemandPushConsumer
logging.disable(logging.CRITICAL)

watchdog(60)
class ConsumeResult(enum.Enum):  # the 5.x client's enum, by name (no client needed)
    SUCCESS = 0
    FAILURE = 1
b = broker(); send(b, 1)
done = []
class Listener:
    def consume(self, m):
        done.append(m.message_id)
        return ConsumeResult.FAILURE if len(done) == 1 else ConsumeResult.SUCCESS
def backoff(attempt): raise ValueError("backoff bug")
pc = DemandPushConsumer(b, "g", Listener(), {TOPIC: None}, consumption_thread_count=2,
                        invisible_duration=1, retry_backoff=backoff, shutdown_timeout=2)
pc.startup()
time.sleep(1.0)  # real-time: the push consumer is consuming before the messages come
send(b, 5)
time.sleep(3.0)  # real-time: the failed message's nack and the rest's deliveries happen on real threads
print("running:", pc.running, "consumed:", len(done), pc.statistics())
ok = len(done) >= 6 or not pc.running
try: pc.shutdown()
except Exception as e: print("shutdown:", e)
if not ok:
    fail("the push consumer stopped consuming while `running` stays True")
print("OK")
