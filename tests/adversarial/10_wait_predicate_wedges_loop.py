# loop.wait(predicate) runs the predicate under the loop's (non-reentrant) lock. A predicate that
# calls the loop's own public readers (statistics()/state()) deadlocks that lock: the whole loop
# wedges for good -- no settle, no renewal, run() never returns, held messages are never settled.
from common import *
b, c = setup(4)
loop = ConsumeLoop(c, lambda m: time.sleep(0.1), invisible_duration=3, workers=2)  # real-time: the handler's work, so the loop is busy while wait() runs
t = threading.Thread(target=loop.run, daemon=True); t.start()
w = threading.Thread(target=lambda: loop.wait(lambda s: loop.state().held == 0 and s.acked >= 4, timeout=2),
                     daemon=True)
w.start()
w.join(4)
stopped = loop.stop(timeout=1)
t.join(3)
print("wait alive", w.is_alive(), "stop ->", stopped, "run alive", t.is_alive())
assert not w.is_alive(), "wait(timeout=2) still blocked after 4 s: its predicate deadlocked the loop's lock"
assert not t.is_alive(), "run() never returns"
