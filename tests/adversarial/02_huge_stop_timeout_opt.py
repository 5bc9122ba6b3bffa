# FlowOptions stop_timeout=1e10 accepted; run()'s drain overflows
from common import *
b, c = setup(3)
res = {}
loop = ConsumeLoop(c, lambda m: None, invisible_duration=5, workers=2, stop_timeout=1e10)
def r():
    try: res["ok"] = loop.run()
    except BaseException as e: res["err"] = e
t = threading.Thread(target=r, daemon=True); t.start(); time.sleep(0.5)  # real-time: run() is receiving when stop() comes (the finding's timing)
loop.stop()
t.join(5)
print(res, "alive", t.is_alive(), loop.state(), loop.statistics())
assert "err" not in res, f"run() raised {res.get('err')!r}"
assert not t.is_alive()
# after run() is gone, the loop is not finished: stop() says it has not returned
assert loop.stop(timeout=0.2) is True, "stop() says run() has not returned, although it has (drain aborted)"
