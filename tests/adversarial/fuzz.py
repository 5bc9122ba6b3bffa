import random, sys, math
from common import *
seed = int(sys.argv[1]); rnd = random.Random(seed)
N = rnd.randint(5, 40)
b, c0 = setup(N, min_inv=1)
lock = threading.Lock(); running = set(); problems = []; results = {}  # (mid, attempt) -> ok
class C:
    consumer_group = "g"
    min_receive_invisible = 1
    def receive(self, n, inv):
        if rnd.random() < 0.05: raise RuntimeError("recv down")
        return c0.receive(n, inv)
    def ack(self, m):
        with lock:
            r = results.get((m.message_id, m.delivery_attempt))
        if r is not True: problems.append(f"ack of {m.message_id}/{m.delivery_attempt} result {r}")
        if rnd.random() < 0.05: raise RuntimeError("ack lost")
        c0.ack(m)
    def change_invisible_duration(self, m, s):
        if rnd.random() < 0.05: raise RuntimeError("renew down")
        c0.change_invisible_duration(m, s)
def h(m):
    k = m.message_id
    with lock:
        if k in running: problems.append(f"two copies of {k}")
        running.add(k)
    try:
        r = rnd.random()
        if r < 0.15: time.sleep(rnd.uniform(0.3, 1.5));  # real-time: a slow handler, the fuzzer's drawn work
        elif r < 0.25: raise ValueError("x")
        elif r < 0.30: raise KeyboardInterrupt()
        elif r < 0.33: raise SystemExit()
        else: time.sleep(rnd.uniform(0, 0.05))  # real-time: a short handler, the fuzzer's drawn work
        with lock: results[(k, m.delivery_attempt)] = True
        return None
    except BaseException:
        with lock: results[(k, m.delivery_attempt)] = False
        raise
    finally:
        with lock: running.discard(k)
policy = rnd.choice(["aggressive", "round_robin", "cost_aware", "random"])
kw = dict(invisible_duration=rnd.choice([1, 2, 3]), workers=rnd.randint(1, 4), policy=policy)
if rnd.random() < 0.6: kw["handler_timeout"] = rnd.choice([0.2, 0.5, 1.0]); kw["hang_grace"] = rnd.choice([0, 0.1, 0.5])
if rnd.random() < 0.5: kw["key"] = lambda m: "k%d" % (hash(m.message_id) % 3)
if rnd.random() < 0.3: kw["prefetch"] = rnd.randint(1, 5)
if rnd.random() < 0.3: kw["max_batch"] = rnd.randint(1, 4)
try:
    loop = ConsumeLoop(C(), h, **kw)
except Exception as e:
    print("ctor", e); sys.exit(0)
t = threading.Thread(target=loop.run, daemon=True); t.start()
time.sleep(rnd.uniform(0.2, 3))  # real-time: stop() lands at a drawn moment of a real run
st = rnd.choice([None, 0, 0.05, 0.5, 1.0])
t0 = time.monotonic()
r = loop.stop(timeout=st) if st is not None else loop.stop()
el = time.monotonic() - t0
if st is not None and el > st + 0.7: problems.append(f"stop({st}) took {el:.2f}")
t.join(15)
if t.is_alive(): problems.append("run() did not return in 15 s")
time.sleep(2.0)  # real-time: hung handlers end and late outcomes settle on their own threads (hung handlers end, late outcomes settle)
s = loop.statistics()
lhs = s.acked + s.retry_scheduled + s.given_back + s.ack_errors + s.expired + s.held
if s.received != lhs: problems.append(f"received {s.received} != {lhs}")
if s.held: problems.append(f"held {s.held} after the end")
if s.succeeded + s.failed + s.not_started != s.reported + (s.not_started - 0) - 0 and False: pass
print(seed, kw.get("handler_timeout"), policy, "stop", st, s if problems else "", problems[:5])
sys.exit(1 if problems else 0)
