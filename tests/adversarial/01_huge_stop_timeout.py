# stop(timeout=1e10): finite, accepted, but overflows threading timeouts
from common import *
b, c = setup(3)
done = []
loop = ConsumeLoop(c, lambda m: done.append(m), invisible_duration=5, workers=2)
t = threading.Thread(target=lambda: done.append(("run", loop.run())), daemon=True)
t.start(); time.sleep(0.5)  # real-time: run() is receiving when stop() comes (the finding's timing)
err = None
t0 = time.monotonic()
try:
    r = loop.stop(timeout=1e10)
except Exception as e:
    err = e
t.join(5)
print("stop err:", repr(err), "run alive:", t.is_alive(), "elapsed", time.monotonic()-t0)
assert err is None, f"stop(timeout=1e10) raised {err!r}"
assert not t.is_alive(), "run() did not return"
