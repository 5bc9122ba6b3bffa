# ack_threads=1.5 / nan pass FlowOptions validation; run() then fails in range() (promise: options fail at construction)
from common import *
for v in (1.5, float("nan")):
    b, c = setup(1)
    try:
        loop = ConsumeLoop(c, lambda m: None, invisible_duration=5, workers=1, ack_threads=v)
    except (ValueError, TypeError):
        continue
    threading.Timer(0.5, loop.stop).start()
    err = None
    try: loop.run()
    except Exception as e: err = e
    print(v, repr(err))
    assert err is None, f"ack_threads={v} accepted at construction, run() raised {err!r}"
