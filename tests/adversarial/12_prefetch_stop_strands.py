# prefetch>0: the feeder thread is inside dispatcher.submit (a slow key=, 0.5 s) when stop(timeout=0)
# closes the dispatcher and gives the backlog back. The feeder's message was "submitted" then, so it is
# skipped; submit then raises DispatcherClosed, the feeder puts it back to WAITING -- after the last
# give-back. It stays held for ever (never settled nor given back; held=1 after run() returned).
from common import *
b, c = setup(1)
def key(m):
    if threading.current_thread().name.startswith("rmqtrace-feeder"):
        time.sleep(0.5)  # real-time: a slow key= on the feeder thread, the finding's premise
    return "k"
loop = ConsumeLoop(c, lambda m: None, invisible_duration=5, workers=1, prefetch=1, key=key)
t = threading.Thread(target=loop.run, daemon=True); t.start()
loop.wait(lambda s: s.received >= 1, timeout=3); time.sleep(0.1)  # real-time: the feeder is inside key= when stop(timeout=0) comes (the feeder is in key= now)
ok = loop.stop(timeout=0)
t.join(3); time.sleep(1.0)  # real-time: the feeder's key= returns after the stop: what it does then is the finding
s = loop.statistics()
print("stop ->", ok, "run alive", t.is_alive(), s, loop.state())
assert s.held == 0, f"run() returned but {s.held} message(s) still held, never settled or given back"
