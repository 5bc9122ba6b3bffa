# A bounded stop(timeout=0.2) after an earlier stop() or stop(timeout=3): stop() keeps the earlier
# deadline of the two, but the drain already waits in dispatcher.close(timeout=<old>): run() drains
# past the new deadline and stop(timeout=0.2) returns False (run() still running).
from common import *
bad = []
for first in (None, 3.0):
    b, c = setup(1)
    loop = ConsumeLoop(c, lambda m: time.sleep(4), invisible_duration=5, workers=2)  # real-time: the handler's work outlasts the stop under test
    t = threading.Thread(target=loop.run, daemon=True); t.start()
    loop.wait(lambda s: s.received >= 1, timeout=3); time.sleep(0.2)  # real-time: the received message reaches its worker (no public event for a start)
    threading.Thread(target=loop.stop, kwargs={"timeout": first}, daemon=True).start()  # e.g. SIGTERM
    time.sleep(0.3)  # real-time: the first stop() (on its thread) is under way when the second comes
    t0 = time.monotonic()
    ok = loop.stop(timeout=0.2)
    print(f"stop({first}) then stop(timeout=0.2) -> {ok} after {time.monotonic()-t0:.2f} s")
    if not ok: bad.append(first)
assert not bad, f"stop(timeout=0.2) after stop({bad}): the drain did not end at the new deadline"
