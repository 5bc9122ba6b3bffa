# DemandPushConsumer(shutdown_timeout=1e10) is accepted (only NaN/negative refused); shutdown() then
# raises OverflowError out of loop.stop() and the loop's run() thread dies mid-drain
from common import *
from tracer.clients.demandpush import DemandPushConsumer
b = EmbeddedBroker(min_receive_invisible=1); b.create_topic("t")
class L:
    def consume(self, m):
        from types import SimpleNamespace
        return None
dp = DemandPushConsumer(b, "g", L(), {"t": None}, consumption_thread_count=2, invisible_duration=5,
                        shutdown_timeout=1e10)
dp.startup(); time.sleep(0.5)  # real-time: the push consumer is consuming when shutdown() comes
err = None
try:
    dp.shutdown()
except Exception as e:
    err = e
print(repr(err))
assert err is None, f"shutdown() raised {err!r}"
