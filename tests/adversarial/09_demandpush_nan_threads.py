# DemandPushConsumer(consumption_thread_count=nan) passes the constructor's check (nan < 1 is False);
# the error only comes at startup() (docstring: ValueError for a bad option from the constructor)
from common import *
from tracer.clients.demandpush import DemandPushConsumer
b = EmbeddedBroker(min_receive_invisible=1); b.create_topic("t")
class L:
    def consume(self, m): return None
try:
    dp = DemandPushConsumer(b, "g", L(), {"t": None}, consumption_thread_count=float("nan"), invisible_duration=5)
except (ValueError, TypeError):
    raise SystemExit(0)
try:
    dp.startup()
except Exception as e:
    raise AssertionError(f"accepted by the constructor, refused only at startup(): {e!r}")
raise AssertionError("consumption_thread_count=nan accepted and started")
