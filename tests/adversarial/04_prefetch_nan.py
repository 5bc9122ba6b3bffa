# prefetch=NaN passes FlowOptions validation; then neither poll() nor a feeder feeds: held forever
from common import *
b, c = setup(3)
ran = []
try:
    loop = ConsumeLoop(c, lambda m: ran.append(m), invisible_duration=5, workers=2, prefetch=float("nan"))
except (ValueError, TypeError):
    raise SystemExit(0)  # refused at construction: fine
t = threading.Thread(target=loop.run, daemon=True); t.start()
time.sleep(2)  # real-time: the finding is that nothing is fed for a while: a duration observed
st = loop.statistics(); n_ran = len(ran)
print(st.received, len(ran), loop.state())
ok = loop.stop(timeout=1)
print("stop", ok, loop.statistics())
assert n_ran == st.received and st.received > 0, f"received {st.received} but ran {n_ran} within 2 s: held unrun"
