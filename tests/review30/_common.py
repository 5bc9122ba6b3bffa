"""Shared helpers for the review30 scripts (not a finding)."""
import os, sys, threading, time
from tracer.embedded import EmbeddedBroker, Producer, SimpleConsumer, Message

TOPIC = "t"

def watchdog(seconds, what="hang"):
    def fire():
        print(f"WATCHDOG: {what} after {seconds}s -> FAIL", flush=True)
        os._exit(1)
    t = threading.Timer(seconds, fire); t.daemon = True; t.start(); return t

def broker(**kw):
    kw.setdefault("min_receive_invisible", 1)
    return EmbeddedBroker(**kw)

def send(b, n, key=None, topic=TOPIC):
    p = Producer(b, [topic]); p.startup()
    ids = []
    for i in range(n):
        m = Message(); m.topic = topic; m.body = f"m{i}".encode()
        if key is not None:
            try: m.message_group = key
            except Exception: pass
        ids.append(p.send(m).message_id)
    return ids

def consumer(b, group="g", topic=TOPIC, await_duration=0.05):
    c = SimpleConsumer(b, group, {topic: None}, await_duration=await_duration); c.startup(); return c

class Wrap:
    """A client double forwarding to `inner`; override methods to inject faults."""
    def __init__(self, inner): self.inner = inner
    def __getattr__(self, name): return getattr(self.inner, name)
    def receive(self, n, inv): return self.inner.receive(n, inv)
    def ack(self, m): return self.inner.ack(m)
    def change_invisible_duration(self, m, s): return self.inner.change_invisible_duration(m, s)

def run_in_thread(loop, **kw):
    box = {}
    def go():
        try: box["stats"] = loop.run(**kw)
        except BaseException as e: box["exc"] = e
    t = threading.Thread(target=go, daemon=True); t.start(); return t, box

def fail(msg):
    print("FAIL:", msg, flush=True); sys.exit(1)
