# renew_margin=0.001 (accepted: in (0, invisible_duration)) is below the keeper's 50 ms tick: a lease is
# only "due" in its last millisecond, which the keeper almost never sees -> the lease of a running
# handler runs out (leases_lost) and the broker hands the message to someone else while it runs.
# Fixed by refusing a margin below MIN_RENEW_MARGIN_S at construction; the smallest margin accepted
# must then hold the lease of a handler that runs past it.
from common import *
import tracer.clients.consume_options as options
MIN_RENEW_MARGIN_S = getattr(options, "MIN_RENEW_MARGIN_S", 0.15)  # 3 of the keeper's shortest ticks
for margin in (0.001, MIN_RENEW_MARGIN_S):
    b, c = setup(1)
    try:
        loop = ConsumeLoop(c, lambda m: time.sleep(2.5), invisible_duration=1, renew_margin=margin, workers=1)  # real-time: a handler longer than the lease, so renewals must happen
    except (ValueError, TypeError):
        assert margin < MIN_RENEW_MARGIN_S, f"renew_margin={margin} refused"
        continue
    t = threading.Thread(target=loop.run, daemon=True); t.start()
    time.sleep(3.2); loop.stop(timeout=1)  # real-time: past several lease ends on the real keeper
    s = loop.statistics(); print(margin, s)
    assert s.leases_lost == 0 and s.acked == 1, f"lease lost while its handler ran (leases_lost={s.leases_lost}, acked={s.acked})"
