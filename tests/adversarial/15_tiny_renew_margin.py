# renew_margin=0.001 (accepted: in (0, invisible_duration)) is below the keeper's 50 ms tick: a lease is
# only "due" in its last millisecond, which the keeper almost never sees -> the lease of a running
# handler runs out (leases_lost) and the broker hands the message to someone else while it runs.
from common import *
b, c = setup(1)
loop = ConsumeLoop(c, lambda m: time.sleep(2.5), invisible_duration=1, renew_margin=0.001, workers=1)
t = threading.Thread(target=loop.run, daemon=True); t.start()
time.sleep(3.2); loop.stop(timeout=1)
s = loop.statistics(); print(s)
assert s.leases_lost == 0 and s.acked == 1, f"lease lost while its handler ran (leases_lost={s.leases_lost}, acked={s.acked})"
