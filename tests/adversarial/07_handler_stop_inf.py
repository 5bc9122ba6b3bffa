# a handler calling stop(timeout=math.inf) on its own loop: stop() waits for run(), run()'s drain
# waits for that handler -> both hang for ever (stop(timeout=None) from a handler is fine)
import math
from common import *
b, c = setup(1)
res = {}
def h(m):
    res["stop"] = loop.stop(timeout=math.inf)
loop = ConsumeLoop(c, h, invisible_duration=5, workers=2)
t = threading.Thread(target=lambda: res.setdefault("run", loop.run()), daemon=True); t.start()
t.join(6)
print(res.keys(), "run alive", t.is_alive(), loop.state())
assert not t.is_alive(), "run() and the handler's stop(timeout=inf) deadlock each other"
