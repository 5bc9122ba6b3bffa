from common import *
b, c = setup(0)
loop = ConsumeLoop(c, lambda m: None, invisible_duration=5, workers=1)
t = threading.Thread(target=loop.run, daemon=True); t.start(); time.sleep(0.2)  # real-time: run() is receiving when wait() is called
threading.Timer(0.5, loop.stop).start()
err=None
try:
    loop.wait(lambda s: False, timeout=1e10)
except Exception as e: err=e
print(repr(err)); loop.stop(timeout=2)
assert err is None, f"wait(timeout=1e10) raised {err!r}"
