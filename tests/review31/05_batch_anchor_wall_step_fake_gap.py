"""Promise (docs/semconv.md, tracer/path/clock.py, issue #31 item 2): "a message's consumer stamps
are its wall time at the pull advanced by the monotonic clock, so a wall-clock step does not empty
them" / "the same-process gaps of one message are durations on the monotonic clock" — a wall-clock
step must not change a consumer gap.

Steps: MessageTracer on a ManualClock; the batch path every seam uses (ConsumeLoop._start_traces,
ReceivedTraces.received): the batch's pull time is read on the wall clock once, then
start_message(info, pulled_ns) per message. NTP steps the wall clock forward by 30 s between the
batch's reading and a message's start_message (the monotonic clock moves 1 ms). The message is then
enqueued and handled 1 ms later.

Expected: client_buffer ≈ 1 ms and consumer_wait ≈ 2 ms (monotonic distances).
Actual: client_buffer ≈ 30 s: start_message places the anchor `now - pulled_ns` back on the
monotonic clock, a distance measured on the *wall* clock, so the step becomes part of the message's
own gaps (a fake 30 s consumer wait; a slow-consumer_wait keep threshold keeps it as "slow"). The
batch's wall reading has no monotonic partner (ReceivedTraces.received even reads one, `since`, and
does not pass it).
"""
import sys
sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
from _rig import Rig
from tracer.path.clock import ManualClock
from tracer.path.message import describe
from tracer.path.stages import Outcome, Stage
from tracer.path.stamps import compute_gaps
import time

clock = ManualClock(time.time_ns())
rig = Rig(clock=clock)
rig.send(b"x")
(msg,) = rig.consumer.receive(1, 30)
pulled_ns = clock.wall_ns()          # the batch's pull, as ConsumeLoop._start_traces reads it
clock.advance(1_000_000)             # 1 ms passes ...
clock.step_wall(30_000_000_000)      # ... and NTP steps the wall clock forward 30 s
t = rig.tracer.start_message(describe(msg), pulled_ns)
clock.advance(1_000_000)
t.mark(Stage.DISPATCH_ENQUEUE)
clock.advance(1_000_000)
with t.handler_scope():
    clock.advance(1_000_000)
t.finish(Outcome.SUCCESS)
gaps = {g.gap.name: g.seconds for g in compute_gaps(t.stamps)}
print({k: round(v, 4) for k, v in gaps.items()})
assert gaps["client_buffer"] < 1.0, f"a 30 s wall-clock step became {gaps['client_buffer']:.3f} s of client_buffer"
