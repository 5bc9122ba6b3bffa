# ConsumeLoop.wait(predicate, timeout=nan) is accepted and never times out (the Dispatcher's waits
# refuse NaN with ValueError); also -1 / "1" probed below
from common import *
b, c = setup(0)
loop = ConsumeLoop(c, lambda m: None, invisible_duration=5, workers=1)
t = threading.Thread(target=loop.run, daemon=True); t.start(); time.sleep(0.2)  # real-time: run() is receiving when wait() is called
res = {}
def w():
    try: res["r"] = loop.wait(lambda s: s.received > 0, timeout=float("nan"))
    except Exception as e: res["e"] = e
th = threading.Thread(target=w, daemon=True); th.start(); th.join(3)
print("wait(timeout=nan):", "still blocked after 3 s" if th.is_alive() else res)
loop.stop(timeout=1)
assert not th.is_alive(), "wait(timeout=nan) neither refused nor timed out: blocks for ever"
