"""Issue #30, second review (tests/review30 02-05, 07, 08, 11): the broker calls, the leases, the
policies and the stop request, each fault as a class over its siblings.

* every broker call the loop makes on a held message (ack, nack, renewal) raising a BaseException
  leaves nothing held, the counters adding up, the keeper renewing; the interrupt goes on;
* a broker clock ahead of or behind this process's never makes a dead lease look live;
* every policy: a worker hung past its TIMEOUT is no room, and free_slots() is bounded however
  large the policy's buffer;
* the start gate: a message the loop holds no lease for never starts;
* the stop request takes no lock (signal-safe).
"""

from __future__ import annotations

import ast
import inspect
import threading
from typing import Any, Callable

import pytest
from embedded_rig import consumer_with_messages
from manual_clock import Clock
from waiting import wait_until

from tracer.clients.consume import ConsumeLoop
from tracer.clients.consume_options import LeaseOptions
from tracer.clients.lease import Lease, LeaseKeeper
from tracer.dispatch import Aggressive, CostAware, Random, RoundRobin, scheduler
from tracer.dispatch.scheduler import QUEUED, Entry

WALL0 = 1_700_000_000.0
LOOK_AHEAD = getattr(scheduler, "LOOK_AHEAD", 4096)  # read softly: the test runs against older code too


class Raising:
    """A client double: ``call`` raises ``exc`` once, then forwards."""

    def __init__(self, inner: Any, call: str, exc: BaseException) -> None:
        self.inner, self.call, self.exc = inner, call, exc

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _maybe(self, name: str) -> None:
        if self.call == name and self.exc is not None:
            exc, self.exc = self.exc, None  # type: ignore[assignment]
            raise exc

    def receive(self, n: int, inv: float) -> Any:
        return self.inner.receive(n, inv)

    def ack(self, m: Any) -> Any:
        self._maybe("ack")
        return self.inner.ack(m)

    def change_invisible_duration(self, m: Any, s: float) -> Any:
        self._maybe("change_invisible_duration")
        return self.inner.change_invisible_duration(m, s)


def _adds_up(loop: ConsumeLoop) -> None:
    s = loop.statistics()
    assert s.received == s.acked + s.retry_scheduled + s.given_back + s.ack_errors + s.expired + s.held, s


# -- 02: a BaseException from a settle call --------------------------------------------------------
@pytest.mark.parametrize("exc", [KeyboardInterrupt("ctrl-c"), SystemExit(3)], ids=type)
@pytest.mark.parametrize("call", ["ack", "nack"])
def test_a_base_exception_from_a_settle_call_leaves_nothing_held(call: str, exc: BaseException) -> None:
    clock = Clock()
    _, inner = consumer_with_messages(clock)
    client = Raising(inner, "ack" if call == "ack" else "change_invisible_duration", exc)

    def handler(m: Any) -> None:
        if call == "nack":
            raise ValueError("fails: nacked")

    loop = ConsumeLoop(client, handler, invisible_duration=5, workers=1, monotonic=clock,
                       wall=lambda: WALL0 + clock())
    try:
        assert loop.poll() == 1
        assert loop.wait(lambda s: s.reported >= 1, timeout=30)
        with pytest.raises(type(exc)):
            loop.settle_ready()
        s = loop.statistics()
        assert s.held == 0 and s.ack_errors == 1, s
        _adds_up(loop)
    finally:
        loop.stop()
        loop.dispatcher.close(timeout=5)


# -- every settle site: a BaseException from one broker call leaves none of the batch held ----------
# (site, op): where the loop makes the call, and which call raises. The driven settle_ready() and
# renew_leases() (the caller's thread), run()'s ack threads and keeper pool, an outcome reported
# after run() returned (settled inline on the worker that reports it), DemandPushConsumer's loop.
SETTLE_SITES = [("settle_ready", "ack"), ("settle_ready", "nack"), ("renew_leases", "renew"),
                ("run", "ack"), ("run", "nack"), ("run", "renew"), ("late", "ack"), ("late", "nack"),
                ("demand_push", "ack"), ("demand_push", "nack")]


def _two_held(site: str, op: str, exc: BaseException) -> tuple[Clock, Raising, Callable[[Any], None], threading.Event]:
    """Two messages on an embedded broker behind a client whose first ``op`` call raises ``exc``;
    a handler that fails when ``op`` is a nack, and (``renew``, ``late``) runs until released."""
    clock = Clock()
    _, inner = consumer_with_messages(clock, bodies=(b"a", b"b"))
    client = Raising(inner, "ack" if op == "ack" else "change_invisible_duration", exc)
    release = threading.Event()
    if op == "renew" or site == "late":
        release.clear()
    else:
        release.set()

    def handler(m: Any) -> None:
        release.wait(60)
        if op == "nack":
            raise ValueError("fails: nacked")

    return clock, client, handler, release


def _run_on_a_thread(loop: ConsumeLoop) -> tuple[threading.Thread, list[BaseException]]:
    raised: list[BaseException] = []

    def run() -> None:
        try:
            loop.run()
        except BaseException as e:  # noqa: BLE001 - the test reads what run() re-raised
            raised.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, raised


@pytest.mark.parametrize(("site", "op"), SETTLE_SITES, ids=[f"{s}-{o}" for s, o in SETTLE_SITES])
def test_a_base_exception_from_one_broker_call_leaves_no_message_held(site: str, op: str,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """The fault harness's finding (steps ``send_junk_for_a_callable(key-raise)``,
    ``fail_a_call(nack, base, before)``, ``keeper_before_the_watchdog``): the first of two ready
    settles raised a BaseException in the driven settle_ready(), and the second outcome stayed
    queued, held. The rule at every site: the call that raised is counted an error, every other
    message of the batch is still settled (or renewed), and then the exception goes on — raised to
    the caller, re-raised by run(), held by DemandPushConsumer.error; logged where no caller is left."""
    exc = KeyboardInterrupt("ctrl-c in the client")
    clock, client, handler, release = _two_held(site, op, exc)
    if site == "demand_push":
        _demand_push_case(client, op, exc)
        return
    loop = ConsumeLoop(client, handler, invisible_duration=5, renew_margin=1, workers=2, ack_threads=1,
                       monotonic=clock, wall=lambda: WALL0 + clock())
    try:
        if site in ("settle_ready", "renew_leases"):
            assert loop.poll() == 2
            if site == "settle_ready":
                assert loop.wait(lambda s: s.reported >= 2, timeout=30)
                with pytest.raises(KeyboardInterrupt):
                    loop.settle_ready()
            else:
                wait_until(lambda: len(loop.dispatcher.running()) == 2, timeout=30, what="both handlers to run")
                clock.advance(4.5)  # both leases due (margin 1 s)
                with pytest.raises(KeyboardInterrupt):
                    loop.renew_leases()
                s = loop.statistics()
                assert (s.lease_errors, s.leases_extended) == (1, 1), (
                    f"one renewal raised: the other lease of the pass must still be renewed: {s}")
                release.set()
                assert loop.wait(lambda s: s.reported >= 2, timeout=30)
                loop.settle_ready()
        elif site == "run":
            runner, raised = _run_on_a_thread(loop)
            if op == "renew":
                wait_until(lambda: len(loop.dispatcher.running()) == 2, timeout=30, what="both handlers to run")
                clock.advance(4.5)
                wait_until(lambda: loop.statistics().leases_extended >= 1, timeout=30,
                           what="the other lease renewed after one renewal raised")
                release.set()
            runner.join(30)
            assert not runner.is_alive() and raised == [exc], raised
        else:  # late: both outcomes come after run() returned from a bounded stop
            runner, raised = _run_on_a_thread(loop)
            wait_until(lambda: len(loop.dispatcher.running()) == 2, timeout=30, what="both handlers to run")
            assert loop.stop(timeout=0.05)
            runner.join(30)
            assert not runner.is_alive() and raised == []
            release.set()
            wait_until(lambda: loop.statistics().held == 0, timeout=30, what="both late outcomes settled")
            assert any(r.exc_info is not None and r.exc_info[1] is exc for r in caplog.records), (
                "a BaseException from a settle no caller hears of must at least be logged")
        s = loop.statistics()
        assert s.held == 0 and s.ack_errors == (0 if op == "renew" else 1), s
        _adds_up(loop)
    finally:
        release.set()
        loop.stop()
        loop.dispatcher.close(timeout=5)


def test_a_base_exception_from_a_settle_on_a_worker_before_run_returns_is_re_raised() -> None:
    """The late site while run() is still in its drain: a handler outran a bounded stop, and its
    outcome is settled inline on the worker after the dispatcher closed; the ack raises a Ctrl-C.
    The worker only logged it; now it is handed to run(), which re-raises it since it had not
    returned yet. The window is held open deterministically: the drain's last step (closing the
    keeper's pool) waits until the late settle is done."""
    exc = KeyboardInterrupt("ctrl-c in the client")
    clock = Clock()
    _, inner = consumer_with_messages(clock)
    client = Raising(inner, "ack", exc)
    release = threading.Event()
    loop = ConsumeLoop(client, lambda m: release.wait(60), invisible_duration=5, workers=1, monotonic=clock,
                       wall=lambda: WALL0 + clock())
    close_pool = loop._keeper.close

    def close_after_the_late_settle() -> None:
        release.set()
        wait_until(lambda: loop.statistics().held == 0, timeout=30, what="the late outcome settled on its worker")
        close_pool()

    loop._keeper.close = close_after_the_late_settle  # type: ignore[method-assign]
    try:
        runner, raised = _run_on_a_thread(loop)
        wait_until(lambda: len(loop.dispatcher.running()) == 1, timeout=30, what="the handler to run")
        loop.stop(timeout=0.05)
        runner.join(30)
        assert not runner.is_alive()
        assert raised == [exc], f"run() returned after the late settle raised, without re-raising it: {raised}"
        s = loop.statistics()
        assert s.held == 0 and s.ack_errors == 1, s
    finally:
        release.set()
        loop.stop()
        loop.dispatcher.close(timeout=5)


def _demand_push_case(client: Raising, op: str, exc: BaseException) -> None:
    from tracer.clients.demandpush import DemandPushConsumer
    from tracer.clients.quiet import import_quietly
    from tracer.embedded import EmbeddedBroker

    rmq = import_quietly()

    class Listener(rmq.MessageListener):  # type: ignore[misc,name-defined]
        def consume(self, message: Any) -> Any:
            return rmq.ConsumeResult.SUCCESS if op == "ack" else rmq.ConsumeResult.FAILURE

    class OnTheDouble(DemandPushConsumer):
        def _simple_consumer(self) -> Any:
            return client

    dp = OnTheDouble(EmbeddedBroker(), "G", Listener(), {"T": None}, consumption_thread_count=2,
                     shutdown_timeout=10)
    dp.startup()
    try:
        wait_until(lambda: not dp.running, timeout=30, what="the loop to end on the interrupt")
        assert dp.error is exc
        s = dp.statistics()
        assert s.held == 0 and s.ack_errors == 1, s
        _adds_up(dp.loop)  # type: ignore[arg-type]
    finally:
        dp.shutdown()


# The calls that reach the broker on a held message (a settle, a give-back that may settle inline,
# a renewal); a loop making one of them must not stop at its BaseException.
BROKER_CALLING = frozenset({"_settle", "_give_back_unrun", "_renew_if_free", "_renew_one"})
# loops allowed to: why
# (a give-back makes its broker call only when settled inline, once run()'s drain reached SETTLING)
LOOP_EXEMPT = {"_own": "gives the batch back while key='s own BaseException propagates; the loop is "
                       "receiving, so each give-back is queued, never settled inline",
               "_offer": "feeds the dispatcher, only before the drain's SETTLING phase (the feeder stops "
                         "there, run()'s own feed comes before it): each give-back is queued"}


def _catches_base(t: ast.Try) -> bool:
    return any(h.type is None or (isinstance(h.type, ast.Name) and h.type.id == "BaseException") for h in t.handlers)


def _loops_cut_short(module: Any) -> list[str]:
    """Every loop of ``module`` that calls a broker-calling method outside a ``try`` (inside the loop)
    that catches BaseException: one raising call would end the loop, the rest of its batch undone."""
    tree = ast.parse(inspect.getsource(module))
    found: list[str] = []

    def visit(node: ast.AST, func: str, in_loop: bool, guarded: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            # a nested function (each_then_raise's callable) is not the loop's body
            func, in_loop, guarded = getattr(node, "name", func), False, False
        elif isinstance(node, (ast.For, ast.While)):
            in_loop, guarded = True, False
        elif isinstance(node, ast.Try) and in_loop and _catches_base(node):
            for child in node.body:
                visit(child, func, in_loop, True)
            for rest in (*node.handlers, *node.orelse, *node.finalbody):
                visit(rest, func, in_loop, guarded)
            return
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in BROKER_CALLING
              and in_loop and not guarded and func not in LOOP_EXEMPT):
            found.append(f"{module.__name__}.{func}: {node.func.attr}() at line {node.lineno}")
        for child in ast.iter_child_nodes(node):
            visit(child, func, in_loop, guarded)

    visit(tree, "<module>", False, False)
    return found


@pytest.mark.parametrize("module", ["consume", "lease", "demandpush"])
def test_no_loop_over_held_messages_stops_at_one_calls_base_exception(module: str) -> None:
    """The sibling rule, discovered: every loop that makes broker calls on held messages either goes
    through ``each_then_raise`` (the rest of the batch, then the exception) or catches the
    BaseException itself (the ack threads, the keeper's pool)."""
    import importlib

    mod = importlib.import_module(f"tracer.clients.{module}")
    assert _loops_cut_short(mod) == []


# -- 03: a BaseException from a renewal ------------------------------------------------------------
@pytest.mark.parametrize("exc", [KeyboardInterrupt("ctrl-c"), SystemExit(3)], ids=type)
@pytest.mark.parametrize("wait", [True, False], ids=["caller", "pool"])
def test_a_base_exception_from_a_renewal_never_ends_renewals(wait: bool, exc: BaseException) -> None:
    """On the caller's thread it propagates with the keeper's state clean; on the keeper's pool it
    goes to the owner and the pool thread lives on: the next pass renews (renew_threads=1)."""
    clock = Clock()
    _, inner = consumer_with_messages(clock)
    client = Raising(inner, "change_invisible_duration", exc)
    (msg,) = inner.receive(1, 5)
    events: list[str] = []
    renewed = threading.Event()

    def report(what: str, error: BaseException | None, why: str) -> None:
        events.append(what)
        if what == "leases_extended":
            renewed.set()

    interrupts: list[BaseException] = []
    keeper = LeaseKeeper(client, LeaseOptions(invisible_duration=5, renew_threads=1), clock, report, None,
                         interrupts.append)
    h = Lease(msg, clock() + 1.0)
    try:
        if wait:
            with pytest.raises(type(exc)):
                keeper.renew([h], {}, wait=True)
        else:
            keeper.renew([h], {}, wait=False)
            wait_until(lambda: bool(interrupts), timeout=30, what="the pool's renewal to hand its interrupt over")
            assert interrupts == [exc]
        assert events == ["lease_errors"]
        assert not h.lock.locked()
        keeper.renew([h], {}, wait=wait)  # the next pass
        assert renewed.wait(30), events
    finally:
        keeper.close()


# -- a renewal the broker refuses because the lease is gone (40013) ---------------------------------
@pytest.mark.parametrize("where", ["renew_leases", "keeper_pool"])
def test_a_renewal_refused_because_the_lease_is_gone_is_a_lost_lease(where: str) -> None:
    """The broker's clock passed the handle's end while the loop's has not (a stall the loop did not
    see, a skew): the proxy refuses the renewal with 40013, "receipt handle is expired"
    (``AbstractProcessor.validateReceiptHandle``), and hands the message out again. The keeper takes
    that as the lost lease it is — counted ``leases_lost``, never renewed again — so the handler's
    success is not acked (``expired``: the broker refuses that too). Before: a lease error retried
    on every pass, and an ack sent on a dead handle."""
    clock, broker_clock = Clock(), Clock()
    _, inner = consumer_with_messages(broker_clock)
    release = threading.Event()
    loop = ConsumeLoop(inner, lambda m: release.wait(60), invisible_duration=5, renew_margin=1, workers=1,
                       monotonic=clock)
    runner: threading.Thread | None = None
    try:
        if where == "keeper_pool":
            runner, raised = _run_on_a_thread(loop)
        else:
            assert loop.poll() == 1
        wait_until(lambda: len(loop.dispatcher.running()) == 1, timeout=30, what="the handler to run")
        broker_clock.advance(6.0)  # past the handle's end at the broker
        clock.advance(4.5)  # due, and live as far as the loop can tell
        if where == "renew_leases":
            loop.renew_leases()
            loop.renew_leases()  # a lost lease is not asked for again
        else:
            wait_until(lambda: loop.statistics().leases_lost == 1, timeout=30, what="the refusal taken as a lost lease")
        s = loop.statistics()
        assert (s.leases_lost, s.lease_errors, s.leases_extended) == (1, 1, 0), (
            f"invariant counters_add_up: a renewal refused because the lease was gone is a lost lease: {s}")
        release.set()
        if runner is not None:
            loop.stop()
            runner.join(30)
            assert not runner.is_alive() and raised == []
        else:
            assert loop.wait(lambda s: s.reported >= 1, timeout=30)
            loop.settle_ready()
        s = loop.statistics()
        assert (s.expired, s.acked, s.ack_errors, s.held, s.lease_errors) == (1, 0, 0, 0, 1), (
            f"invariant counters_add_up: a lost lease's success is let expire, no ack sent on a dead handle: {s}")
        _adds_up(loop)
    finally:
        release.set()
        loop.stop()
        loop.dispatcher.close(timeout=5)


# -- 04: a skewed broker clock ---------------------------------------------------------------------
@pytest.mark.parametrize("skew", [-3.0, 0.0, 3.0])
@pytest.mark.parametrize("stall", [0.0, 3.0])
def test_a_skewed_broker_clock_never_makes_a_dead_lease_live(skew: float, stall: float) -> None:
    """The broker's wall clock ``skew`` seconds off this process's; the process stalls ``stall``
    seconds after the broker popped the message, inside receive (lease 2 s): it starts exactly
    when its lease is live."""
    from tracer.embedded import EmbeddedBroker, Message, Producer, SimpleConsumer

    clock = Clock()
    broker = EmbeddedBroker(min_receive_invisible=1, monotonic=clock,
                            wall_ms=lambda: int((WALL0 + clock() + skew) * 1000))
    broker.create_topic("T")
    p = Producer(broker, ["T"])
    p.startup()
    m = Message()
    m.topic, m.body = "T", b"x"
    p.send(m)
    inner = SimpleConsumer(broker, "G", {"T": None}, await_duration=0.0)
    inner.startup()

    class Stall(Raising):
        def receive(self, n: int, inv: float) -> Any:
            got = self.inner.receive(n, inv)
            if got:
                clock.t += stall
            return got

    ran: list[Any] = []
    loop = ConsumeLoop(Stall(inner, "", None), ran.append, invisible_duration=2, workers=1,  # type: ignore[arg-type]
                       monotonic=clock, wall=lambda: WALL0 + clock())
    try:
        assert loop.poll() == 1
        assert loop.wait(lambda s: s.reported >= 1, timeout=30)
        assert bool(ran) is (stall < 2), loop.statistics()
    finally:
        loop.stop()
        loop.dispatcher.close(timeout=5)


# -- 05, 07: every policy: a hung worker is no room; free_slots() is bounded -----------------------
POLICIES = [Aggressive(), CostAware(window=4), RoundRobin(buffer=3), Random(buffer=3, seed=1)]


def _entry(i: int, key: str | None = None) -> Entry[Any]:
    e: Entry[Any] = Entry(i, None, key, 0.0)
    e.seq = i
    return e


def _run_on_every_worker(s: Any) -> list[tuple[int, Entry[Any]]]:
    """Admit until every worker holds one; (worker, entry) of each held one."""
    held: list[tuple[int, Entry[Any]]] = []
    i = 0
    while s.busy < s.workers:
        e = _entry(i)
        i += 1
        got = s.admit(e)
        if isinstance(got, int):
            held.append((got, e))
        else:
            s.take_queued()  # a draw that went to a busy worker's buffer: taken out again
    return held


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
def test_a_hung_worker_is_no_room(policy: Any) -> None:
    """One of two workers hung past its TIMEOUT: free_slots() counts only room a live worker
    serves, nothing is dealt behind the hung one; both hung: no room at all."""
    s = policy.scheduler(2)
    (w, first), (_, second) = _run_on_every_worker(s)
    s.expire(w, first)  # reported TIMEOUT, still running
    s.done(1 - w, second)
    room = s.free_slots()
    taken = 0
    for i in range(100, 140):
        got = s.admit(_entry(i))
        if got is not QUEUED and not isinstance(got, int):
            break
        assert got != w and (got is not QUEUED or s.bound != w), "dealt to (or behind) the hung worker"
        taken += 1
    assert taken == room > 0
    both = policy.scheduler(2)
    for worker, e in _run_on_every_worker(both):
        both.expire(worker, e)
    assert both.free_slots() == 0


@pytest.mark.parametrize("policy", [RoundRobin(buffer=10**400), Random(buffer=10**400, seed=2),
                                    CostAware(window=10**400), Aggressive(max_parked=10**400)],
                         ids=lambda p: p.name)
def test_free_slots_is_bounded_however_large_the_buffer(policy: Any) -> None:
    s = policy.scheduler(4)
    assert 0 < s.free_slots()
    assert s.free_slots() <= 4 + LOOK_AHEAD or policy.name in ("cost_aware", "aggressive")
    assert len(getattr(s, "_upcoming", ())) <= 4 + LOOK_AHEAD


# -- 08: the start gate ------------------------------------------------------------------------------
def test_a_message_the_loop_holds_no_lease_for_never_starts() -> None:
    clock = Clock()
    _, inner = consumer_with_messages(clock)
    ran: list[Any] = []
    loop = ConsumeLoop(inner, ran.append, invisible_duration=5, workers=1, monotonic=clock)
    (msg,) = inner.receive(1, 5)  # never owned by the loop (or settled and dropped already)
    try:
        with pytest.raises(Exception) as caught:
            loop._start_handler(msg)
        assert type(caught.value).__name__ == "_NotStarted"
        assert ran == []
    finally:
        loop.stop()
        loop.dispatcher.close(timeout=5)


# -- 11: the stop request takes no lock ------------------------------------------------------------
def test_the_stop_request_takes_no_lock_a_signal_could_interrupt() -> None:
    """Every lock reachable from the loop's lock and its stop request held by this thread (as an
    interrupted main thread may hold them), the installed handler and stop() still return."""
    import signal

    clock = Clock()
    _, inner = consumer_with_messages(clock)
    loop = ConsumeLoop(inner, lambda m: None, invisible_duration=5, workers=1, monotonic=clock)
    loop.poll()
    old = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    loop.install_signal_handlers()
    handler = signal.getsignal(signal.SIGTERM)
    for sig, h in old.items():
        signal.signal(sig, h)
    held = [loop._lock]
    for v in vars(loop._stop).values() if hasattr(loop._stop, "__dict__") else ():
        lock = getattr(v, "_lock", v)  # an Event's Condition holds its lock as _lock
        if hasattr(lock, "acquire") and hasattr(lock, "release"):
            held.append(lock)
    done = threading.Event()

    def interrupt() -> None:
        assert callable(handler)
        handler(signal.SIGTERM, None)
        loop.stop()
        done.set()

    for lock in held:
        lock.acquire()
    try:
        t = threading.Thread(target=interrupt, daemon=True)
        t.start()
        ok = done.wait(10)
    finally:
        for lock in reversed(held):
            lock.release()
    try:
        assert ok, "the signal-safe stop waited for a lock"
        assert loop.stopping
    finally:
        loop.stop()
        loop.dispatcher.close(timeout=5)


@pytest.mark.parametrize("engine", ["thread", "asyncio"])
@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
def test_both_engines_run_everything_beside_a_hung_worker(policy: Any, engine: str) -> None:
    """One of two workers hangs past its TIMEOUT (the asyncio handler swallows its cancellation
    and keeps waiting): every message submitted afterwards, as far as free_slots() allows, runs on
    the other worker while the hang lasts — none waits behind the hung one."""
    import asyncio

    from tracer.dispatch import AsyncDispatcher, Dispatcher
    from tracer.path.clock import ManualClock

    clock = ManualClock()
    ran: list[int] = []
    release = threading.Event()
    if engine == "thread":
        started = threading.Event()

        def handler(i: int) -> None:
            if i == 0:
                started.set()
                release.wait(600)  # past the wait below: only the test's release ends the hang
            else:
                ran.append(i)

        d: Any = Dispatcher(handler, policy=policy, workers=2, handler_timeout=1.0, clock=clock)
        try:
            d.submit(0)
            assert started.wait(30)
            clock.advance_s(2.0)
            assert d.check_timeouts() == 1
            n = d.free_slots()
            assert n > 0
            for i in range(1, n + 1):
                assert d.submit(i, timeout=0)
            wait_until(lambda: len(ran) == n, timeout=30, what="every message beside the hung worker to run")
            assert d.statistics().queued == 0
        finally:
            release.set()
            d.close(timeout=5)
        return

    async def main() -> None:
        gate = asyncio.Event()

        async def handler(i: int) -> None:
            if i == 0:
                while not gate.is_set():
                    try:
                        await gate.wait()
                    except asyncio.CancelledError:
                        clock.advance_s(0.0)  # swallowed: it hangs on past its TIMEOUT
            else:
                ran.append(i)

        ad: AsyncDispatcher[int] = AsyncDispatcher(handler, policy=policy, workers=2, handler_timeout=0.05)
        try:
            await ad.submit(0)
            for _ in range(400):
                if ad.statistics().timed_out:
                    break
                await asyncio.sleep(0.01)
            assert ad.statistics().timed_out == 1
            n = ad.free_slots()
            assert n > 0
            for i in range(1, n + 1):
                assert await ad.submit(i, timeout=0)
            for _ in range(3000):
                if len(ran) == n:
                    break
                await asyncio.sleep(0.01)
            assert len(ran) == n and ad.statistics().queued == 0
        finally:
            gate.set()
            await ad.close(timeout=5)

    asyncio.run(main())


@pytest.mark.parametrize("policy", [RoundRobin(buffer=3), Random(buffer=3, seed=1)], ids=lambda p: p.name)
def test_a_key_routed_to_a_hung_worker_is_given_back_not_held(policy: Any) -> None:
    """Round-robin/random route a key to one fixed worker: once that worker hangs past its TIMEOUT,
    a message of another key routed to it cannot start while the hang lasts; the loop gives it
    back (a peer may take it) instead of holding and renewing it. Keys "a" and "b" route to
    worker 1, "d" to worker 0 (crc32 % 2)."""
    from tracer.embedded import Message, Producer

    clock = Clock()
    broker, inner = consumer_with_messages(clock, bodies=(b"a",))
    release = threading.Event()
    ran: list[bytes] = []

    def handler(m: Any) -> None:
        if m.body == b"a":
            release.wait(600)
        ran.append(m.body)

    loop = ConsumeLoop(inner, handler, policy=policy, workers=2, handler_timeout=1, invisible_duration=30,
                       key=lambda m: m.body.decode(), monotonic=clock)
    try:
        assert loop.poll() == 1

        wait_until(lambda: len(loop.dispatcher.running()) == 1, timeout=30, what="the hung handler to start")
        clock.advance(2.0)
        assert loop.dispatcher.check_timeouts() == 1
        loop.settle_ready()  # the hung message is given back
        p = Producer(broker, ["T"])
        p.startup()
        for body in (b"b", b"d"):
            m = Message()
            m.topic, m.body = "T", body
            p.send(m)
        assert loop.poll() == 2
        wait_until(lambda: ran == [b"d"], timeout=30, what="d to run on the live worker")
        assert loop.wait(lambda s: s.reported >= 2, timeout=30)  # a's TIMEOUT, d's success (b never reached it)
        loop.settle_ready()
        s = loop.statistics()
        assert s.held == 0 and s.given_back == 1, s  # b went back unrun; nothing waits for the hang
        _adds_up(loop)
    finally:
        release.set()
        loop.stop()
        loop.dispatcher.close(timeout=5)
