"""Faults of the consume loop: stop() from a signal handler, infinite timeouts."""
import math
import threading
import time

import pytest

from test_consume import pipeline, run_in_thread


def test_stop_while_this_thread_holds_the_lock_returns_and_the_loop_stops():
    # a signal handler runs on the thread it interrupted: that thread may hold the loop's lock
    broker, loop = pipeline(3, lambda m: None)
    t = run_in_thread(loop)
    with loop._lock:  # the interrupted main thread, inside statistics() or wait()'s predicate
        t0 = time.monotonic()
        assert loop.stop() in (False, True)  # fails before: blocks forever on the held lock
        assert time.monotonic() - t0 < 1.0
    t.join(10)
    assert not t.is_alive()
    assert loop.stopping


def test_stop_with_infinite_timeout_waits_without_bound():
    broker, loop = pipeline(3, lambda m: None)
    t = run_in_thread(loop)
    loop.wait(lambda s: s.acked == 3, 10)
    assert loop.stop(timeout=math.inf) is True  # fails before: OverflowError
    t.join(5)
    assert not t.is_alive()


@pytest.mark.parametrize("bad", [math.nan, -1.0])
def test_stop_refuses_nan_and_negative_timeouts(bad):
    broker, loop = pipeline(0, lambda m: None)
    with pytest.raises(ValueError):
        loop.stop(timeout=bad)
    loop.stop()


def test_demandpush_refuses_nan_shutdown_timeout_at_construction():
    from test_demandpush import Listener

    from tracer.clients.demandpush import DemandPushConsumer
    from tracer.embedded import EmbeddedBroker

    with pytest.raises(ValueError):  # fails before: NaN passed `< 0` and was accepted
        DemandPushConsumer(client_configuration=EmbeddedBroker(), consumer_group="g",
                           message_listener=Listener(), subscription={"t": None}, shutdown_timeout=math.nan)
    DemandPushConsumer(client_configuration=EmbeddedBroker(), consumer_group="g",
                       message_listener=Listener(), subscription={"t": None}, shutdown_timeout=math.inf)
