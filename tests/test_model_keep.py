"""A model of the keep policy and the hold, driven through MessageTracer (issue 19).

Messages start (head-sampled or not, in a job or not, slow or not), their handlers open user spans
(nested, some outliving the handler), finish with success or failure, or time out — the watchdog
first, the handler returning later —, or are handled and never acked; late spans end, the clock
advances (the hold's ticker runs), traffic stops, the provider is flushed or shut down, and the
small bounds (spans, traces, age) are hit. After every step the promise holds:

- ``kept_messages_are_whole``: every failed, timed-out, slow, head-sampled message is exported
  with its own spans (process, handler once it returned, gaps) from its finish on, and every job's
  latest finisher once the job has been idle for ``job_idle_s`` (or at a flush): the bounded wait;
  a user span of such a message that ended and is not exported was counted as dropped by the hold;
- ``nothing_exported_without_its_parent``: every exported span's parent is exported, or still
  open (it will end), or remote (the producer's);
- ``nothing_exported_twice``;
- ``holds_stay_within_bounds``: held spans and traces within their bounds, nothing undecided
  older than the age limit after a tick;
- ``every_message_is_accounted``: started = kept + dropped + pending (the policy's decisions) +
  unfinished, and each drop is counted by reason;
- ``no_consumer_gap_is_zero_unless_its_stamps_are_equal_on_the_monotonic_clock``: the wall clock
  steps back and forward between any two steps (NTP), and every consumer gap of every message is
  still exactly the monotonic time between its two stamps (issue 31 item 2: a clock held after a
  step back read 0 for every gap, and the keep policy dropped the slow messages);
- ``no_exported_span_starts_before_its_parent``: some producers' clocks are ahead (up to past the
  whole consumer path); every exported span starts no earlier than its exported parent, and a
  ``process`` span no earlier than its remote ``send`` parent, which started at the produce stamp
  (issue 31 item 10: the consumer drew its spans from a produce time moved back, the send the raw one).
- ``a_kept_victims_blocker_is_kept_or_its_link_is_absent`` (issue 31 item 7): a message blamed on
  another (head-of-line, the live blame's verdict) whose wait span is exported links to its
  blocker's handler span only when that span is exported too — or the blocker is still undecided
  (running, unfinished, or pending as its job's latest finisher): it is then promised kept.
- ``every_settled_delivery_is_measured_once_with_its_outcome`` (issue 31 items 1, 3, 5): every
  finished message — acked, failed, nacked after its handler returned (the wrappers'
  ``change_invisible_duration``), timed out (and its hung handler returning later), refused
  unstarted (``not_started``: no handler observation), or run under a lease that was lost — is
  counted once under its own outcome in ``rmqtrace_messages_total``; the handler and end-to-end
  histograms hold exactly one observation per finished message whose handler ran; every lost
  lease is counted once by reason, and its message is kept. A handler still running when the
  provider shuts down is finished then (``timeout``, ``HandlerAbandoned``), measured once.
- ``a_refused_copy_exports_no_handler_span`` (review #31 finding 13): a ``not_started`` copy's
  trace holds a ``process`` span and no ``handler``.
- ``a_message_that_ran_twice_shows_both_runs_linked`` (review #31 findings 5, 6): a message whose
  lease was lost — while its handler ran, or after its finish (between the handler's end and the
  ack) — is handed out again (``redelivered``, some copies refused unstarted beside it); every
  redelivery that runs is exported, linked (``rmqtrace.link.reason=lease_lost``) to the lost run,
  whose spans are exported too, unless the hold had to let that run go for its bounds; no copy
  refused unstarted takes the link; no lease-lost link points at a span that is not exported.
"""

from __future__ import annotations

import contextvars
import functools
import os
from dataclasses import dataclass, field
from typing import Any, Callable

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased
from prometheus_client import CollectorRegistry

from tracer.clients.official import Processing, ReceivedTraces
from tracer.clients.refusal import HANDLE_EXPIRED
from tracer.path.blocking import Verdict
from tracer.path.clock import ManualClock
from tracer.path.message import MessageInfo
from tracer.path.names import BLAME_REASON, BLAME_SPAN, GAP_SPANS, LEASE_LOST_REASONS, LINK_LEASE_LOST, LINK_REASON
from tracer.path.propagation import JOB_ID, PRODUCE_NS, TRACEPARENT
from tracer.path.stages import Outcome, Stage
from tracer.path.stamps import causal, drawn
from tracer.telemetry.hold import HoldingSpanProcessor
from tracer.telemetry.keep import KeepPolicy
from tracer.telemetry.metrics import TracerMetrics
from tracer.telemetry.tracephase import KeepFate, TracePhase
from tracer.telemetry.tracer import MessageTrace, MessageTracer

LONG = os.environ.get("RMQTRACE_LONG") == "1"
S = 1_000_000_000
JOB_IDLE_S, MAX_AGE_S, MAX_SPANS, MAX_TRACES = 10.0, 60.0, 12, 4
SLOW_WAIT_S = 0.5  # over the 0.1 s dispatch_wait threshold


class _Collect(SpanProcessor):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []
        self.closed = False

    def on_end(self, span: ReadableSpan) -> None:
        if not self.closed:
            self.spans.append(span)

    def shutdown(self) -> None:
        self.closed = True

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


@dataclass
class _Msg:
    i: int
    t: MessageTrace
    ctx: contextvars.Context
    job: str | None
    sampled: bool
    slow: bool
    produce_ns: int = 0  # the producer's stamp: its send span started there
    running: bool = True
    finished: bool = False
    outcome: Outcome | None = None
    open: list[Any] = field(default_factory=list)  # the user's spans not yet ended
    ended: list[int] = field(default_factory=list)  # span ids of the user's spans that ended
    opened_ids: set[int] = field(default_factory=set)
    monos: dict[Stage, int] = field(default_factory=dict)  # the monotonic clock at each consumer stamp
    lease_lost: str | None = None  # the loop lost its lease while holding it
    mid: str = ""  # its message id: a redelivery shares the lost run's
    lost_from: int | None = None  # the lost run this redelivery was told of at its start (its index)
    lost_pending: bool = False  # lost after its finish while pending as its job's latest finisher
    lost_gone: bool = False  # lost after its finish, dropped, and no longer in the hold (its bounds): not kept
    overran: bool = False  # finished while its handler still ran (the watchdog's timeout, the shutdown)
    wire: Any = None  # received through the wrappers' ReceivedTraces (TracedSimpleConsumer, the instrumentor)

    @property
    def must_keep(self) -> bool:
        # a copy refused unstarted has no dispatch_wait (no handler start) to be slow by
        slow = self.slow and self.outcome is not Outcome.NOT_STARTED
        ran = self.outcome is not Outcome.NOT_STARTED
        return self.finished and (self.sampled or slow or (self.lease_lost is not None and not self.lost_gone)
                                  or (self.lost_from is not None and ran)
                                  or self.outcome in (Outcome.FAILURE, Outcome.TIMEOUT))


@dataclass(eq=False)
class _Wire:
    """A received 5.x message as the wrappers see it (the attributes ``describe`` reads)."""

    topic: str
    message_id: str
    properties: dict[str, str]
    store_timestamp: int


class _Refused(Exception):
    """The broker's refusal of a settle for an expired receipt handle (code 40013)."""

    code = HANDLE_EXPIRED


def named_invariant(check: Callable[[Any], None]) -> Any:
    """``@invariant()`` whose failure names it (``invariant <name>: ...``), as the other models'
    do: tests/mutation/run_seeded.py counts a seeded bug caught only by the invariant it names."""

    @functools.wraps(check)
    def named(self: Any) -> None:
        try:
            check(self)
        except AssertionError as exc:
            raise AssertionError(f"invariant {check.__name__}: {exc}") from exc

    return invariant()(named)


class KeepHoldModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.out = _Collect()
        self.hold = HoldingSpanProcessor([self.out], max_spans=MAX_SPANS, max_traces=MAX_TRACES, max_age_s=MAX_AGE_S,
                                         clock=self.clock, ticker=False)
        self.provider = TracerProvider(sampler=ParentBased(ALWAYS_OFF))
        self.provider.add_span_processor(self.hold)
        self.policy = KeepPolicy({"dispatch_wait": 0.1}, job_idle_s=JOB_IDLE_S, max_jobs=2, clock=self.clock)
        self.registry = CollectorRegistry()
        self.mt = MessageTracer(consumer_group="g", tracer_provider=self.provider, clock=self.clock,
                                keep=self.policy, hold=self.hold, metrics=TracerMetrics(self.registry))
        self.user = self.provider.get_tracer("user")
        # the wrappers' settles (ack, nack, a refused one) of messages received through them; never
        # let go here (the hold's own bounds are what the model draws)
        self.received = ReceivedTraces(self.mt, max_age_s=10.0**9, max_traces=10**6)
        self.msgs: list[_Msg] = []
        self.closed = False
        self.open_at_shutdown: set[int] = set()  # user spans that ended only after the provider shut down
        self.flushed_at = -1  # clock when force_flush last settled every pending trace
        # the policy's job bookkeeping, as it promises it: the latest finisher and when the job was last seen
        self.jobs: dict[str, tuple[int, int, _Msg]] = {}  # job -> (last_end, seen, latest), least recent first
        self.latest_end = 0
        self.settled: set[int] = set()  # messages the critical-path promise covers now
        self.ticked_at = self.clock.monotonic_ns()
        self.blame: dict[int, int] = {}  # victim -> blocker (message indexes)

    # -- helpers ------------------------------------------------------------------------------
    def _live(self) -> list[_Msg]:
        return [m for m in self.msgs if m.running]

    def _decided(self, m: _Msg) -> None:
        """Mirror the policy's job state for a finished message (to know the critical path)."""
        end = m.monos.get(Stage.HANDLER_END, 0)  # the policy's timers run on the monotonic clock
        if not m.job or not end:
            return
        self.latest_end = max(self.latest_end, end)
        prev = self.jobs.pop(m.job, None)
        if prev is None and len(self.jobs) >= 2:
            oldest = next(iter(self.jobs))
            self.settled.add(self.jobs.pop(oldest)[2].i)  # retired: its latest finisher kept
        last_end, latest = (prev[0], prev[2]) if prev else (0, m)
        if end >= last_end:
            last_end, latest = end, m
        self.jobs[m.job] = (last_end, self.latest_end, latest)

    def _undecided(self, m: _Msg) -> bool:
        """Not finished, or its job's latest finisher pending (the policy decides it later)."""
        return not m.finished or (m.job is not None and any(latest is m for _e, _s, latest in self.jobs.values()))

    def _tick(self) -> None:
        self.hold.tick()
        now = self.ticked_at = self.clock.monotonic_ns()
        for job in list(self.jobs):
            _end, seen, latest = self.jobs[job]
            if now - seen < JOB_IDLE_S * S:
                break
            self.settled.add(latest.i)
            del self.jobs[job]

    def _finish(self, m: _Msg, outcome: Outcome, error: BaseException | None,
                settle: Callable[[], None] | None = None) -> None:
        """``m`` settles with ``outcome``: through ``settle`` (a wrapper's ack or nack, which must
        finish the trace itself), else by the dispatcher's finish."""
        if Stage.HANDLER_START in m.monos and Stage.HANDLER_END not in m.monos:
            m.monos[Stage.HANDLER_END] = self.clock.monotonic_ns()  # the watchdog's finish stamps it
        if settle is None:
            m.t.finish(outcome, error)
        else:
            settle()
        m.overran = m.running and outcome is not Outcome.NOT_STARTED
        m.finished, m.outcome = True, outcome
        self._decided(m)

    # -- rules --------------------------------------------------------------------------------
    @precondition(lambda self: not self.closed and len(self.msgs) < 16)
    # biased to ordinary messages of few jobs: those are the ones held for the critical path
    @rule(job=st.sampled_from(["a", "a", "b", None, "c"]), sampled=st.sampled_from([False, False, False, True]),
          slow=st.sampled_from([False, False, False, True]),
          producer_ahead_ms=st.sampled_from([0, 0, 0, 1, 40, 900]), wrapped=st.booleans())
    def start(self, job: str | None, sampled: bool, slow: bool, producer_ahead_ms: int, wrapped: bool) -> None:
        self._start(job, sampled, slow, producer_ahead_ms, f"m{len(self.msgs)}", wrapped)

    def _start(self, job: str | None, sampled: bool, slow: bool, producer_ahead_ms: int, mid: str,
               wrapped: bool = False) -> _Msg:
        i = len(self.msgs)
        produce_ns = self.clock.now_ns() - 2_000_000 + producer_ahead_ms * 1_000_000
        props = {TRACEPARENT: f"00-{i + 1:032x}-{i + 1:016x}-{'01' if sampled else '00'}",
                 PRODUCE_NS: str(produce_ns)}
        if job:
            props[JOB_ID] = job
        store_ms = self.clock.now_ns() // 1_000_000 - 1
        wire = _Wire("jobs", mid, props, store_ms) if wrapped else None
        if wire is not None:  # TracedSimpleConsumer.receive / the instrumentor's patched receive
            (t,) = self.received.received([wire])
        else:
            t = self.mt.start_message(MessageInfo(topic="jobs", message_id=mid, properties=props, store_ms=store_ms))
        pulled = self.clock.monotonic_ns()
        t.mark(Stage.DISPATCH_ENQUEUE)
        self.clock.advance_s(SLOW_WAIT_S if slow else 0.001)
        ctx = contextvars.copy_context()
        ctx.run(t.__enter__)  # each handler in a context of its own, as on its own worker
        monos = {Stage.CLIENT_PULL: pulled, Stage.DISPATCH_ENQUEUE: pulled, Stage.HANDLER_START: self.clock.monotonic_ns()}
        m = _Msg(i, t, ctx, job, sampled, slow, produce_ns, monos=monos, mid=mid, wire=wire)
        self.msgs.append(m)
        return m

    @precondition(lambda self: not self.closed and len(self.msgs) < 16
                  and any(m.lease_lost is not None for m in self.msgs))
    @rule(data=st.data(), slow=st.booleans())
    def redelivered(self, data: st.DataObject, slow: bool) -> None:
        """The broker hands a message whose lease was lost out again (its first run may still
        run: the copy is then usually refused unstarted): a copy of its own, same message id."""
        lost = data.draw(st.sampled_from([m for m in self.msgs if m.lease_lost is not None]))
        remembered = self.mt.lost_run(lost.mid)  # what the tracer tells the copy
        copy = self._start(None, False, slow, 0, lost.mid)
        if remembered is not None:
            copy.lost_from = next(m.i for m in self.msgs if m.t.context == remembered)

    @precondition(lambda self: not self.closed and any(m.running for m in self.msgs))
    @rule(data=st.data(), nested=st.booleans())
    def open_user_span(self, data: st.DataObject, nested: bool) -> None:
        m = data.draw(st.sampled_from(self._live()))
        name = f"user-{m.i}-{len(m.opened_ids)}"
        if nested and m.open:
            parent = m.open[-1]
            span = self.user.start_span(name, context=trace.set_span_in_context(parent))
        else:
            span = m.ctx.run(self.user.start_span, name)
        m.open.append(span)
        m.opened_ids.add(span.get_span_context().span_id)

    @precondition(lambda self: any(m.open for m in self.msgs))
    @rule(data=st.data())
    def end_user_span(self, data: st.DataObject) -> None:
        """Ends the newest open span of a message: while its handler runs, or late (a thread it started)."""
        m = data.draw(st.sampled_from([m for m in self.msgs if m.open]))
        span = m.open.pop()
        span.end()
        if not self.closed:
            m.ended.append(span.get_span_context().span_id)
        else:  # it was still open when the provider shut down: no processor can export it now
            self.open_at_shutdown.add(span.get_span_context().span_id)

    @precondition(lambda self: not self.closed and any(m.running for m in self.msgs))
    @rule(data=st.data(), fail=st.sampled_from([False, False, True]), ack=st.sampled_from([True, True, True, False]))
    def handler_returns(self, data: st.DataObject, fail: bool, ack: bool) -> None:
        """The handler returns; its message is finished (acked) — or never, like processing() without an ack."""
        m = data.draw(st.sampled_from(self._live()))
        self.clock.advance_s(0.001)
        error = RuntimeError("boom") if fail else None
        m.monos.setdefault(Stage.HANDLER_END, self.clock.monotonic_ns())  # unless the watchdog stamped it
        wire = m.wire
        if wire is not None and not m.finished:
            # the end of TracedSimpleConsumer.processing(): a raised exception finishes the trace there
            m.ctx.run(Processing(self.received, wire).__exit__, None if error is None else RuntimeError, error, None)
        else:
            m.ctx.run(m.t.__exit__, None if error is None else RuntimeError, error, None)
        m.running = False
        if m.finished:
            return  # the watchdog (or the shutdown) reported it already: the hung handler coming back
        if fail:
            self._finish(m, Outcome.FAILURE, error, None if wire is None else lambda: None)
        elif ack and wire is None:  # a wrapper's ack or nack is the user's own call after the block: a step
            self._finish(m, Outcome.SUCCESS, None)

    @precondition(lambda self: not self.closed and any(m.running and not m.finished and m.wire is None
                                                       for m in self.msgs))
    @rule(data=st.data())
    def watchdog_times_out(self, data: st.DataObject) -> None:
        """A dispatcher's watchdog (the wrappers have none)."""
        m = data.draw(st.sampled_from([m for m in self.msgs if m.running and not m.finished and m.wire is None]))
        self.clock.advance_s(5.0)
        self._finish(m, Outcome.TIMEOUT, TimeoutError("over 5 s"))

    @precondition(lambda self: not self.closed and len(self.msgs) >= 2
                  and any(m.running and not m.finished and m.slow for m in self.msgs))
    @rule(data=st.data())
    def blamed(self, data: st.DataObject) -> None:
        """The dispatcher's verdict on a slow-waiting running message (a head-of-line victim):
        it waited behind another (any other, finished or not: the blocker's decision usually
        came first)."""
        victim = data.draw(st.sampled_from([m for m in self.msgs if m.running and not m.finished and m.slow]))
        others = [m for m in self.msgs if m is not victim]
        # the usual head-of-line order: an ordinary blocker decided before its victim, drawn first
        quiet = [m for m in others if m.finished and not m.must_keep]
        blocker = data.draw(st.sampled_from(quiet * 3 + others))
        victim.t.blame(Verdict("head_of_line", SLOW_WAIT_S, SLOW_WAIT_S, f"m{blocker.i}", blocker.t), "round_robin")
        self.blame[victim.i] = blocker.i

    @precondition(lambda self: not self.closed and any(not m.running and not m.finished for m in self.msgs))
    @rule(data=st.data())
    def acked_late(self, data: st.DataObject) -> None:
        """A message handled long ago is settled now (its trace may have aged out of the hold)."""
        m = data.draw(st.sampled_from([m for m in self.msgs if not m.running and not m.finished]))
        wire = m.wire
        self._finish(m, Outcome.SUCCESS, None, None if wire is None else lambda: self.received.acked(wire))

    @precondition(lambda self: not self.closed and any(not m.running and not m.finished for m in self.msgs))
    @rule(data=st.data())
    def nacked_after_handling(self, data: st.DataObject) -> None:
        """The user gives a handled message back (``change_invisible_duration`` after ``processing()``,
        ``ReceivedTraces.nacked``): a failure with no exception."""
        handled = [m for m in self.msgs if not m.running and not m.finished]
        # the wrappers' nack first: their change_invisible_duration (issue 31 item 1: it ended nothing)
        m = data.draw(st.sampled_from([m for m in handled if m.wire is not None] * 2 + handled))
        wire = m.wire
        self._finish(m, Outcome.FAILURE, None, None if wire is None else lambda: self.received.nacked(wire))

    @precondition(lambda self: not self.closed and any(
        m.wire is not None and not m.running and not m.finished and m.lease_lost is None for m in self.msgs))
    @rule(data=st.data(), ack=st.booleans())
    def settle_refused(self, data: st.DataObject, ack: bool) -> None:
        """A wrapper's ack or nack the broker refuses: the handle expired (40013). The outcome was
        decided (measured as it), and the lease was lost: the message runs again."""
        m = data.draw(st.sampled_from([m for m in self.msgs if m.wire is not None and not m.running
                                       and not m.finished and m.lease_lost is None]))
        wire, settle = m.wire, self.received.acked if ack else self.received.nacked
        m.lease_lost = "expired"
        self._finish(m, Outcome.SUCCESS if ack else Outcome.FAILURE, None, lambda: settle(wire, _Refused()))

    def _refusable(self) -> list[_Msg]:
        # refused at the gate, at once: no user span, and no victim that started while it "ran" blamed on it
        blockers = set(self.blame.values())
        return [m for m in self.msgs if m.running and not m.finished and not m.opened_ids and m.i not in blockers
                and m.wire is None]  # only a dispatcher's start gate refuses a copy

    @precondition(lambda self: not self.closed and bool(self._refusable()))
    @rule(data=st.data())
    def refused_to_start(self, data: st.DataObject) -> None:
        """The loop's handler refuses this copy (``tracer.dispatch.NotStarted``: its lease is gone,
        its key hangs, another copy runs): the scope exits at once, the outcome is not_started."""
        m = data.draw(st.sampled_from(self._refusable()))
        m.ctx.run(m.t.__exit__, None, None, None)  # the dispatcher reports it without an error
        m.running = False
        del m.monos[Stage.HANDLER_START]  # unstamped at the finish: no handler ran, no job finisher
        self._finish(m, Outcome.NOT_STARTED, None)

    @precondition(lambda self: not self.closed and any(not m.finished and m.lease_lost is None for m in self.msgs))
    @rule(data=st.data(), reason=st.sampled_from(LEASE_LOST_REASONS), again=st.booleans())
    def lease_lost(self, data: st.DataObject, reason: str, again: bool) -> None:
        """The loop's lease on a held message ran out (or was given up on a hung handler): the
        broker may hand it out again; the handler's outcome comes later."""
        m = data.draw(st.sampled_from([m for m in self.msgs if not m.finished and m.lease_lost is None]))
        m.t.lease_lost(reason)
        if again:
            m.t.lease_lost("expired")  # the keeper and the settle both found it gone: once
        m.lease_lost = reason

    @precondition(lambda self: not self.closed and any(
        m.finished and m.lease_lost is None and m.outcome is not Outcome.NOT_STARTED for m in self.msgs))
    @rule(data=st.data())
    def lease_lost_after_finish(self, data: st.DataObject) -> None:
        """The loop's settle finds the lease gone after the handler's outcome was reported (a
        stall between the handler's end and the ack; or the broker refused the ack): counted,
        and the run — kept, or dropped a moment ago and revived — is what the redelivery links to."""
        m = data.draw(st.sampled_from([m for m in self.msgs if m.finished and m.lease_lost is None
                                       and m.outcome is not Outcome.NOT_STARTED]))
        m.t.lease_lost("expired")
        m.lease_lost = "expired"
        m.lost_pending = self._undecided(m)  # kept when its job settles it (superseded or idle), not now
        if self.mt.lost_run(m.mid) != m.t.context:  # not remembered: nothing to link to
            # only a run the hold let go for its bounds (evicted while held: not revivable)
            s = self.hold.statistics()
            assert s.traces_evicted["max_spans"] + s.traces_evicted["max_traces"] > 0, f"m{m.i} not kept for its link"
            m.lost_gone = True

    @rule(seconds=st.sampled_from([0.5, 3.0, 11.0, 61.0]))
    def clock_advances(self, seconds: float) -> None:
        """Time passes with no traffic; the hold's ticker runs."""
        self.clock.advance_s(seconds)
        self._tick()

    @rule(step=st.sampled_from([-3 * S, -300_000_000, 300_000_000, 3 * S]))
    def wall_clock_steps(self, step: int) -> None:
        """NTP steps the wall clock; no time passes (the monotonic clock stays)."""
        self.clock.step_wall(step)

    @precondition(lambda self: not self.closed)
    @rule()
    def force_flush(self) -> None:
        self.provider.force_flush()
        for _end, _seen, latest in self.jobs.values():
            self.settled.add(latest.i)
        self.jobs.clear()

    @precondition(lambda self: not self.closed)
    @rule()
    def shutdown(self) -> None:
        # what is settled at shutdown goes out before the processors close
        for _end, _seen, latest in self.jobs.values():
            self.settled.add(latest.i)
        self.jobs.clear()
        abandoned = [m for m in self.msgs if m.running and not m.finished]
        self.provider.shutdown()
        self.closed = True
        for m in abandoned:  # the shutdown finished them: timeout, HandlerAbandoned
            m.monos.setdefault(Stage.HANDLER_END, self.clock.monotonic_ns())
            m.finished, m.outcome, m.overran = True, Outcome.TIMEOUT, True
            self._decided(m)

    # -- invariants ---------------------------------------------------------------------------
    def _exported(self) -> dict[int, ReadableSpan]:
        return {s.context.span_id: s for s in self.out.spans}

    @named_invariant
    def nothing_exported_twice(self) -> None:
        ids = [s.context.span_id for s in self.out.spans]
        assert len(ids) == len(set(ids))

    @named_invariant
    def nothing_exported_without_its_parent(self) -> None:
        exported = self._exported()
        still_open = {s.get_span_context().span_id for m in self.msgs for s in m.open} | self.open_at_shutdown
        running = {m.t._handler.get_span_context().span_id for m in self.msgs  # noqa: SLF001
                   if m.running and m.t._handler is not None}  # noqa: SLF001
        for s in exported.values():
            if s.parent is None or s.parent.is_remote:
                continue
            assert s.parent.span_id in exported or s.parent.span_id in still_open | running, (
                s.name, [x.name for x in exported.values()])

    @named_invariant
    def kept_messages_are_whole(self) -> None:
        exported = self._exported()
        missing_user = 0
        for m in self.msgs:
            if not (m.must_keep or (m.finished and m.i in self.settled)):
                continue
            if m.lost_pending and self._undecided(m) and m.i not in self.settled:
                continue  # promised kept: written when its job's policy settles it
            ctx = m.t.context  # its process span's context (a redelivery shares the message id)
            process = exported.get(ctx.span_id) if ctx is not None else None
            assert process is not None and process.name == "process jobs", (f"m{m.i}", m)
            ours = {s.name for s in exported.values() if s.parent is not None
                    and s.parent.span_id == process.context.span_id}
            # every gap with a length is a span, and only those (an empty one would get Jaeger's warning)
            d = drawn(m.t.stamps.times)  # what spans are drawn on (from the send's start)
            gaps = {g.name for g in GAP_SPANS if d[g.start] and d[g.end] > d[g.start]}
            # the wait span carries the live blame's verdict, so it is drawn even when empty
            gaps |= {s.name for s in exported.values() if s.name == BLAME_SPAN and BLAME_REASON in s.attributes
                     and s.parent is not None and s.parent.span_id == process.context.span_id}
            ahead = m.produce_ns > causal(m.t.stamps.times)[Stage.PRODUCE]  # may empty them all
            assert (gaps or ahead) and ours - {"handler"} == gaps, (m.i, ours, gaps)
            if not m.running and m.outcome is not Outcome.NOT_STARTED:
                assert "handler" in ours, (m.i, ours)
            missing_user += sum(1 for sid in m.ended if sid not in exported)
        assert missing_user <= self.hold.statistics().dropped, missing_user

    @named_invariant
    def no_consumer_gap_is_zero_unless_its_stamps_are_equal_on_the_monotonic_clock(self) -> None:
        consumer = (Stage.CLIENT_PULL, Stage.DISPATCH_ENQUEUE, Stage.HANDLER_START, Stage.HANDLER_END)
        for m in self.msgs:
            times = m.t.stamps.times
            for a, b in zip(consumer, consumer[1:]):
                if times[a] and times[b]:
                    assert times[b] - times[a] == m.monos[b] - m.monos[a], (m.i, a.name, b.name)

    @named_invariant
    def no_exported_span_starts_before_its_parent(self) -> None:
        exported = self._exported()
        sends = {m.i + 1: m.produce_ns for m in self.msgs}  # the remote send span ids (see start)
        for s in exported.values():
            if s.parent is None:
                continue
            if s.parent.is_remote:
                assert s.start_time >= sends[s.parent.span_id], (s.name, s.start_time, sends[s.parent.span_id])
            elif s.parent.span_id in exported:
                assert s.start_time >= exported[s.parent.span_id].start_time, (s.name, s.parent.span_id)

    @named_invariant
    def a_kept_victims_blocker_is_kept_or_its_link_is_absent(self) -> None:
        exported = self._exported()
        for s in exported.values():
            if s.name != "dispatch_wait" or not s.links:
                continue
            for link in s.links:
                target = link.context.span_id
                if target in exported:
                    continue
                blockers = [m for m in self.msgs if m.t.handler_context() is not None
                            and m.t.handler_context().span_id == target]
                assert len(blockers) == 1, "a blame link to a span that is none of the handlers"
                b = blockers[0]
                # undecided: not finished, or its job's latest finisher pending (promised kept)
                undecided = not b.finished or (b.job is not None and any(
                    latest is b for _e, _s, latest in self.jobs.values()))
                assert undecided or (b.running and b.finished), (
                    f"m{b.i} blocked a kept victim, its decision came, and its handler span was never exported")

    @named_invariant
    def every_settled_delivery_is_measured_once_with_its_outcome(self) -> None:
        labels = {"topic": "jobs", "consumer_group": "g"}
        value = self.registry.get_sample_value
        finished = [m for m in self.msgs if m.finished]
        for outcome in (Outcome.SUCCESS, Outcome.FAILURE, Outcome.TIMEOUT, Outcome.NOT_STARTED):
            counted = value("rmqtrace_messages_total", {**labels, "outcome": outcome.value}) or 0
            assert counted == sum(1 for m in finished if m.outcome is outcome), outcome
        ran = sum(1 for m in finished if m.outcome is not Outcome.NOT_STARTED)
        for stage in ("handler", "end_to_end"):
            observed = value("rmqtrace_stage_duration_seconds_count", {**labels, "stage": stage}) or 0
            assert observed == ran, (stage, observed, ran)
        for reason in LEASE_LOST_REASONS:
            lost = value("rmqtrace_consumer_leases_lost_total", {**labels, "reason": reason}) or 0
            assert lost == sum(1 for m in self.msgs if m.lease_lost == reason), reason

    @named_invariant
    def a_refused_copy_exports_no_handler_span(self) -> None:
        exported = self._exported()
        for m in self.msgs:
            ctx = m.t.context
            if m.outcome is not Outcome.NOT_STARTED or ctx is None:
                continue
            names = {s.name for s in exported.values() if s.context.trace_id == ctx.trace_id}
            assert "handler" not in names, (m.i, names)

    @named_invariant
    def a_message_that_ran_twice_shows_both_runs_linked(self) -> None:
        exported = self._exported()
        s = self.hold.statistics()
        bounded = s.traces_evicted["max_spans"] + s.traces_evicted["max_traces"] + s.traces_evicted["shutdown"]
        for span in exported.values():  # no dangling lease-lost link (a pending job finisher is promised kept)
            for link in span.links:
                if link.attributes and link.attributes.get(LINK_REASON) == LINK_LEASE_LOST:
                    target = [m for m in self.msgs if m.t.context is not None
                              and m.t.context.span_id == link.context.span_id]
                    assert len(target) == 1, "a lease-lost link to a span that is none of the runs"
                    assert link.context.span_id in exported or bounded or self._undecided(target[0]), (
                        span.name, f"links to m{target[0].i}, not exported")
        for m in self.msgs:
            if m.lost_from is None or not m.finished:
                continue
            ctx = m.t.context
            process = exported.get(ctx.span_id) if ctx is not None else None
            if m.outcome is Outcome.NOT_STARTED:
                # it left the lost run to the copy that runs: still remembered for it
                assert process is None or not process.links or all(
                    (link.attributes or {}).get(LINK_REASON) != LINK_LEASE_LOST for link in process.links), m.i
                continue
            lost = self.msgs[m.lost_from]
            lost_ctx = lost.t.context
            assert process is not None, (f"m{m.i}", "a run of a message whose lease was lost is not exported")
            assert [link.context.span_id for link in process.links
                    if (link.attributes or {}).get(LINK_REASON) == LINK_LEASE_LOST] == [lost_ctx.span_id], m.i
            if not bounded and not self._undecided(lost):
                assert lost_ctx.span_id in exported, (f"m{lost.i}", "the lost run is not exported beside its rerun")

    @named_invariant
    def phase_follows_the_message(self) -> None:
        """A trace's TracePhase is the model's: OPEN until its finish; a finish under a running
        handler is OVERRUN until that handler returns (LATE_ENDED); any other finish FINISHED."""
        for m in self.msgs:
            expected = (TracePhase.OPEN if not m.finished else TracePhase.FINISHED if not m.overran
                        else TracePhase.OVERRUN if m.running else TracePhase.LATE_ENDED)
            assert m.t.phase is expected, (f"m{m.i}", m.t.phase, expected)

    @named_invariant
    def fate_follows_the_head_decision(self) -> None:
        """Every message's trace is held (a hold and a policy are set up): a sampled one by the
        head (HEAD_HELD, for good), a dropped one for the policy — UNDECIDED until its finish,
        then past it (deciding, pending, kept, dropped or gone)."""
        for m in self.msgs:
            fate = m.t.fate
            assert m.t.held
            if m.sampled:
                assert fate is KeepFate.HEAD_HELD, (f"m{m.i}", fate)
            elif not m.finished:
                assert fate is KeepFate.UNDECIDED, (f"m{m.i}", fate)
            else:
                assert fate > KeepFate.DECIDING, (f"m{m.i}", fate)

    @named_invariant
    def holds_stay_within_bounds(self) -> None:
        s = self.hold.statistics()
        assert s.held_spans <= MAX_SPANS and s.held_traces <= MAX_TRACES
        # nothing undecided older than the limit as of the last tick (the clock moved on since)
        assert s.oldest_held_s <= MAX_AGE_S + (self.clock.monotonic_ns() - self.ticked_at) / S
        assert sum(s.dropped_by_reason.values()) == s.dropped

    @named_invariant
    def a_running_handlers_trace_is_never_aged_out(self) -> None:
        """Review #31 finding 8: a handler running past max_age lost its trace (and the user's
        spans) to the age limit meant for a message never acked. Only a memory bound or shutdown may
        evict it."""
        s = self.hold.statistics()
        gone = 0
        for m in self.msgs:
            ctx = m.t.context
            if m.running and not m.finished and m.t.held and ctx is not None and not self.hold.holds(ctx.trace_id):
                gone += 1
        bounds = s.traces_evicted["max_spans"] + s.traces_evicted["max_traces"] + s.traces_evicted["shutdown"]
        assert gone <= bounds, (gone, s.traces_evicted)

    @named_invariant
    def every_message_is_accounted(self) -> None:
        k = self.policy.statistics()
        finished = sum(1 for m in self.msgs if m.finished)
        assert k.messages == finished
        assert k.messages == k.kept + k.dropped + k.pending
        assert len(self.msgs) == k.kept + k.dropped + k.pending + sum(1 for m in self.msgs if not m.finished)
        assert k.dropped == sum(k.dropped_by_reason.values()) and k.kept == sum(k.by_reason.values())
        assert k.pending <= 2  # at most one per tracked job


KeepHoldModel.TestCase.settings = settings(max_examples=1500 if LONG else 300, stateful_step_count=40,
                                           deadline=None)
TestKeepHoldModel = KeepHoldModel.TestCase
