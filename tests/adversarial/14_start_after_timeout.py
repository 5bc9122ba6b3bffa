# handler_timeout: the watchdog's clock starts when a worker picks the message up, before the loop's
# start gate (_start_handler) runs user key= for the hung keys. If that gate takes longer than
# handler_timeout, the message is reported TIMEOUT, counted `failed` and nacked (given back) -- and
# then its handler STARTS anyway, on a message the loop no longer holds.
from common import *
b = EmbeddedBroker(min_receive_invisible=1); b.create_topic("t")
c = SimpleConsumer(b, "g", {"t": FilterExpression()}, await_duration=0.05); c.startup()
p = Producer(b, ["t"]); p.startup()
def send(body):
    m = Message(); m.topic = "t"; m.body = body; p.send(m)
started = []; done = threading.Event()
def key(m):
    if m.body == b"A" and threading.current_thread().name != "runner":
        time.sleep(0.6)  # real-time: a slowish key= (a lookup), the finding's premise (a slowish key= (e.g. a lookup), called from a worker's start gate)
    return m.body.decode()
def handler(m):
    started.append((m.body, m.delivery_attempt, time.monotonic()))
    if m.body == b"A":
        done.wait(3)
nacked = []
orig = c.change_invisible_duration
def civ(m, s):
    if s <= 2: nacked.append((m.body, time.monotonic()))   # a give-back (renewals use the lease, 5 s)
    return orig(m, s)
c.change_invisible_duration = civ
loop = ConsumeLoop(c, handler, invisible_duration=5, workers=2, handler_timeout=0.3, key=key)
t = threading.Thread(target=loop.run, name="runner", daemon=True); t.start()
send(b"A"); time.sleep(0.6)  # real-time: A hangs past handler_timeout (0.3 s) on the real watchdog (A hangs, is reported TIMEOUT at 0.3 s)
send(b"B"); time.sleep(1.5)  # real-time: B's start gate runs after A's TIMEOUT on the real watchdog
done.set(); loop.stop(timeout=2)
s = loop.statistics()
print("started", [(b_, a) for b_, a, _ in started]); print("nacked", nacked); print(s)
nb = [ts for b_, ts in nacked if b_ == b"B"]; sb = [ts for b_, a, ts in started if b_ == b"B"]
assert not (nb and sb and sb[0] > nb[0]), "B was given back (TIMEOUT, counted failed) and then its handler started"
