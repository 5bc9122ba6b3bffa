"""A received message's trace: its state, and what the loop, the dispatcher and other traces ask of it.

:class:`TraceState` holds a :class:`~tracer.telemetry.tracer.MessageTrace`'s stamps, spans and keep
decision, and answers everything that is not the message path itself: the producer's context, the
dispatcher's blame and the link to a blocker, a lost lease, an abandoned handler, and the keep
policy's decision for a held trace (decided at the finish, settled later, revived for a link).
``MessageTrace`` adds the message path (handler scope, finish, spans written) in
:mod:`tracer.telemetry.tracer`; the two are one class, as are ``TracerCore`` and ``MessageTracer``
whose private state they share.
"""

from __future__ import annotations

from typing import Any, Callable, Final, NamedTuple, Sequence

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode

from ..path import names as n
from ..path.clock import Anchor, MonoNs, WallNs
from ..path.message import MessageInfo
from ..path.propagation import Carried, resolve_parent
from ..path.stages import Outcome, Stage
from ..path.stamps import MISSING, Stamps
from .attributes import cap, process_attributes
from .keep import PENDING, KeepPolicy
from .spans import DeferredSpan, SpanWriter
from .tracephase import KeepFate, TracePhase
from .tracercore import TracerCore

__all__ = ["PARSE_IF_KEPT", "HeldSpans", "TraceState"]

_START: Final = int(Stage.HANDLER_START)
_END: Final = int(Stage.HANDLER_END)
_CONSUMER: Final = SpanKind.CONSUMER
_ERROR: Final = StatusCode.ERROR
# A held trace's creation link whose traceparent is parsed only if the trace is kept.
PARSE_IF_KEPT: Final = object()


# Members as module constants: a member read off its class is a descriptor call (tracer.py).
_OPEN: Final = TracePhase.OPEN
_HEAD: Final = KeepFate.HEAD
_HEAD_HELD: Final = KeepFate.HEAD_HELD
_UNDECIDED: Final = KeepFate.UNDECIDED
_DECIDING: Final = KeepFate.DECIDING
_PENDING: Final = KeepFate.PENDING
_KEPT: Final = KeepFate.KEPT
_DROPPED: Final = KeepFate.DROPPED
_GONE: Final = KeepFate.GONE
_get_current: Final = otel_context.get_current  # a C static when compiled (tracer.compiled)


class HeldSpans(NamedTuple):
    """A held trace's ``process`` and ``handler`` spans before the keep decision: ids allocated,
    the spans made (:meth:`TraceState._materialize`) and written only if it is kept."""

    writer: SpanWriter
    name: str  # the process span's
    creation: Any  # the producer's context for the creation link, None, or PARSE_IF_KEPT
    pulled_ns: int
    attrs: dict[str, Any]  # the process span's sampling attributes (shared: copied when made)
    inner: SpanContext  # the handler's context (the process's in the compact shape)
    start_ns: int  # the handler's start


class TraceState:
    """A :class:`~tracer.telemetry.tracer.MessageTrace`'s state and all of it but the message path."""

    __slots__ = ("_tracer", "info", "_carried", "_parent", "_parsed", "stamps", "worker", "body", "_ctx", "_process",
                 "_handler", "_token", "_phase", "_scope_start", "_late_end", "_open_handler", "_deferred", "_verdict",
                 "_blame", "anchor", "_lease_lost", "_lost_from", "_written", "_fate", "_must_keep", "_dropped_outcome")

    def __init__(self, tracer: TracerCore, info: MessageInfo, carried: Carried, anchor: Anchor) -> None:
        self._tracer = tracer
        self.anchor = anchor  # the message's timeline: every consumer stamp is read on it
        self.info = info
        self._carried = carried
        # the producer's context once parsed (see `carried`); the hot path reads only this
        self._parent: SpanContext | None = None
        self._parsed = False
        self.stamps = Stamps()
        self.worker: int | None = None
        self.body: bytes | bytearray | str | None = None  # set only when body capture is on
        self._ctx: SpanContext | None = None  # the process span's, once sampled
        self._process: DeferredSpan | None = None
        self._handler: DeferredSpan | None = None
        self._token: object | None = None
        self._phase = _OPEN
        self._scope_start: int | None = None
        self._late_end = 0  # an overrun handler's return (phase LATE_ENDED)
        self._open_handler: DeferredSpan | None = None  # written, waiting for the late handler end
        self._deferred: HeldSpans | None = None  # a held trace's spans, until made (kept) or dropped
        self._verdict: tuple[Any, str] | None = None  # (Verdict, policy) from the dispatcher, until the finish
        # what the spans carry of it (attributes, link to the blocker), made at the finish
        self._blame: tuple[dict[str, Any], tuple[Link, ...]] | None = None
        self._lease_lost: str | None = None  # the consume loop lost this delivery's lease (why)
        self._lost_from: SpanContext | None = None  # an earlier run of this message whose lease was lost
        # our spans of this trace were written (so a link to it resolves): a fact of both fates, a
        # head-sampled trace's at its finish and a held one's when kept (at its finish or later)
        self._written = False
        self._fate = _HEAD  # the keep decision (KeepFate), for the traces that link to it
        # keep it whatever its own decision, and why: a kept victim links to it (blocker), its
        # lease was lost after its finish (lease_lost: its redelivery links to it)
        self._must_keep: str | None = None
        self._dropped_outcome: Outcome | None = None  # to write its spans should it be revived

    @property
    def carried(self) -> Carried:
        """What the producer carried, the traceparent parsed (on first read; bad values counted then)."""
        carried = self._carried
        if carried.traceparent is not None:
            carried = self._carried = Carried(self._producer_context(), carried.produce_ns, carried.job_id,
                                              carried.cost, carried.context)
        return carried

    def _producer_context(self) -> SpanContext | None:
        """The producer's span context, parsed on the first call (a bad one counted then, once)."""
        if not self._parsed:
            self._parent = resolve_parent(self._carried, self._tracer.errors)
            self._parsed = True
        return self._parent

    def mark(self, stage: Stage, ns: int | None = None) -> None:
        self.stamps.times[stage] = ns if ns else self.anchor.now()

    def now(self) -> WallNs:
        """This instant on the message's timeline (its anchor plus monotonic time since)."""
        return self.anchor.now()

    @property
    def trace_id(self) -> int:
        return self._ctx.trace_id if self._ctx is not None else 0

    @property
    def tracer(self) -> TracerCore:
        """The :class:`~tracer.telemetry.tracer.MessageTracer` that made it."""
        return self._tracer

    @property
    def context(self) -> SpanContext | None:
        """The ``process`` span's context (a held trace's allocated one); None when unsampled."""
        return self._ctx

    @property
    def phase(self) -> TracePhase:
        """Where its message path stands (:class:`TracePhase`)."""
        return self._phase

    @property
    def fate(self) -> KeepFate:
        """Its keep decision (:class:`KeepFate`)."""
        return self._fate

    @property
    def held(self) -> bool:
        """Its spans go through a hold: kept back for the keep policy's decision, or head-sampled
        under a hold (kept at its finish). Fixed once its spans open; whether its id is still held
        is the hold's to say (:meth:`HoldingSpanProcessor.holds`)."""
        return self._fate is not _HEAD

    def blame(self, verdict: Any, policy: str) -> None:
        """The dispatcher's verdict on this message's wait (a :class:`tracer.path.blocking.Verdict`,
        whose ``blocker_ref`` is the blocker's trace), given when its handler starts."""
        self._verdict = (verdict, policy)

    def handler_context(self) -> SpanContext | None:
        """The context of the span current in this message's handler (``handler``; ``process`` in
        the compact shape); None when unsampled or not started. A copy refused unstarted has no
        handler span: its ``process`` stands in (what a blame link to it then resolves to)."""
        if self._phase is not _OPEN and self.stamps.times[_START] == MISSING:
            return self._ctx
        if self._handler is not None:
            return self._handler.context
        if self._process is not None:
            return self._process.context
        deferred = self._deferred
        return deferred.inner if deferred is not None else None

    def abandon(self) -> bool:
        """The timed-out handler is let go while it still runs (its dispatcher closed, the
        provider shuts down): end its handler span now — status ERROR, ``error.type`` (kept, else
        ``timeout``), ``rmqtrace.abandoned=true`` — so the user's spans under it have an exported
        parent. True when there was one to end; its late return then ends nothing more."""
        mt = self._tracer
        with mt._end_lock:
            handler, self._open_handler = self._open_handler, None
            if self._phase is not _OPEN:  # a running, unfinished one stays for the shutdown to finish (abandon_handlers)
                mt._abandonable.discard(self)
        if handler is None:
            return False
        try:
            if handler.status.status_code is not _ERROR:
                handler.set_status(Status(_ERROR, "abandoned"))
            attrs = handler.own_attributes()
            attrs.setdefault(n.ERROR_TYPE, Outcome.TIMEOUT.value)
            attrs[n.ABANDONED] = True
            handler.end(end_time=self.anchor.now())
        except Exception as exc:  # noqa: BLE001
            mt.hook_failed("ending an abandoned handler span", exc)
        return True

    def lease_lost(self, reason: str) -> None:
        """The consume loop lost this delivery's lease while holding it (``reason``: ``expired``,
        ran out before a renewal; ``abandoned``, given up on a hung handler): the broker may hand
        the message out again, so it may run twice. Counted (``rmqtrace_consumer_leases_lost_total``),
        marked on the ``process`` span (``rmqtrace.lease.lost``, when the trace is not finished yet),
        the trace kept (keep reason ``lease_lost``), and remembered by message id: the redelivery
        this tracer receives links its ``process`` span to this run (and is kept too). Once per
        delivery.

        Raises:
            ValueError: ``reason`` is not one of ``names.LEASE_LOST_REASONS``.
        """
        if reason not in n.LEASE_LOST_REASONS:
            raise ValueError(f"a lost lease's reason is one of {', '.join(n.LEASE_LOST_REASONS)}, got {reason!r}")
        if self._lease_lost is not None:
            return
        self._lease_lost = reason
        mt = self._tracer
        try:
            if mt.metrics is not None:
                mt.metrics.lease_lost(self.info.topic, mt.consumer_group, reason)
            ctx = self._ctx
            # A run the keep policy dropped at its finish (lost between the handler's end and the
            # ack) is kept after all, revived from the hold while it still has it, so the
            # redelivery's link resolves; one not revivable (or unsampled) has nothing to link to.
            # A held one still deciding is promised kept the same way (the flag may come too late).
            if self.info.message_id and ctx is not None and ctx.is_valid and (
                    self._written or (self._exported_for("lease_lost", True) if self._fate >= _UNDECIDED
                                      else self._phase is _OPEN)):
                mt._remember_lost_run(self.info.message_id, ctx)
        except Exception as exc:  # noqa: BLE001 - the loop's settle must go on
            mt.hook_failed("recording a lost lease", exc)

    def _blame_of(self, verdict: Any, kept: bool) -> tuple[dict[str, Any], tuple[Link, ...]]:
        """The blame attributes and the link to the blocker's handler span — only to a span that
        is exported: a victim written now (``kept``) keeps its blocker (blame-aware keep); one
        written later, if at all, links only to a blocker already kept."""
        attrs: dict[str, Any] = {n.BLAME_REASON: verdict.reason, n.BLAME_AVOIDABLE_WAIT: float(verdict.avoidable_s)}
        links: tuple[Link, ...] = ()
        blocker = verdict.blocker_ref
        if isinstance(blocker, TraceState):
            if blocker.info.message_id:
                attrs[n.BLAME_BLOCKER_MESSAGE_ID] = cap(blocker.info.message_id)
            ctx = blocker.handler_context()
            if ctx is not None and ctx.is_valid:
                if blocker._exported_for("blocker", kept):
                    links = (Link(ctx),)
                elif kept and self._tracer.keep is not None:
                    self._tracer.keep.blocker_unkept()
        return attrs, links

    def _exported_for(self, why: str, keep_it: bool) -> bool:
        """Whether this trace's spans are or will be exported, so a link to it resolves (a kept
        victim's, ``why="blocker"``; a redelivery's after a lost lease, ``why="lease_lost"``).
        ``keep_it``: keep it for that link — when undecided, whatever its decision; when dropped
        a moment ago, revived if the hold still has it (:meth:`HoldingSpanProcessor.revive`);
        counted as kept after all for ``why``."""
        if self._fate < _UNDECIDED:  # not held (never changes once its spans opened)
            return True  # the head decision: sampled (a context to link to) means exported
        mt = self._tracer
        with mt._fate_lock:
            fate = self._fate
            if fate is _UNDECIDED or fate is _DECIDING:
                if keep_it and self._must_keep is None:
                    self._must_keep = why  # its _decide keeps it (reason why)
                return keep_it
            if fate is _KEPT:
                return True
            if fate is _PENDING and keep_it:
                self._must_keep = self._must_keep or why  # its settle keeps it (a job's latest finisher, superseded or not)
                return True
            if fate is not _DROPPED or not keep_it:
                return False
            self._fate = _GONE  # one reviver; a victim racing with it leaves its link out
        ctx, hold, keep, outcome = self._ctx, mt.hold, mt.keep, self._dropped_outcome
        revived = ctx is not None and hold is not None and outcome is not None and hold.revive(ctx.trace_id)
        if revived:
            assert ctx is not None and outcome is not None
            if keep is not None:
                keep.kept_after_all(why)
            try:
                self._write_spans(ctx, outcome, None)
            except Exception as exc:  # noqa: BLE001
                mt.hook_failed("writing a blocker's kept trace", exc)
            with mt._fate_lock:
                self._fate = _KEPT
        return revived

    def _decide(self, keep: KeepPolicy, outcome: Outcome, error: BaseException | None) -> SpanContext | None:
        ctx, hold = self._ctx, self._tracer.hold
        held = self._fate >= _UNDECIDED  # held for the policy (head_held: the head kept it)
        settle = self._settler(outcome, error) if held and self._carried.job_id else None
        mt = self._tracer
        flag: str | None = None
        if self._lease_lost is not None or self._lost_from is not None:
            flag = "lease_lost"  # both runs of a message that may have run twice
        if held:
            with mt._fate_lock:
                self._fate = _DECIDING
                if flag is None and self._must_keep:
                    flag = self._must_keep
        try:
            times = self.stamps.times
            # the policy's timers (job idle, intervals) run on the monotonic clock, as its tick
            # (Anchor.mono_of inline: two NewType calls and a method call less, every held message)
            end = times[_END]
            anchor = self.anchor
            end_mono: MonoNs | None = anchor.mono_ns + (end - anchor.wall_ns) if end else None  # type: ignore[assignment]
            reason = keep.decide(times, outcome, self._carried.job_id, head=ctx is not None and not held,
                                 settle=settle, end_mono=end_mono, flag=flag)
        except Exception as exc:  # noqa: BLE001 - a broken policy must not cost the histograms
            self._tracer.hook_failed("the keep decision", exc)
            reason = "failure"  # err on keeping
        if held:
            flipped: str | None = None
            with mt._fate_lock:
                if reason is None and self._must_keep:  # a kept victim linked to it meanwhile (or a lost lease)
                    reason = flipped = self._must_keep
                self._fate = _PENDING if reason is PENDING else _KEPT if reason is not None else _DROPPED
                if reason is None:
                    self._dropped_outcome = outcome
            if flipped is not None:
                keep.kept_after_all(flipped)
        if self._fate is _HEAD_HELD and ctx is not None and hold is not None:
            hold.release(ctx.trace_id, True)
            return ctx
        if not held or ctx is None or hold is None:
            return ctx
        if reason is PENDING:
            return None
        hold.release(ctx[0], reason is not None)  # its trace id, by index
        return ctx if reason is not None else None

    def _settler(self, outcome: Outcome, error: BaseException | None) -> Callable[[bool], None]:
        """:meth:`_settle` for a job's finisher, as the policy calls it. Its own method: a closure
        in :meth:`_decide` made every local there a cell, and compiled (tracer.compiled) an
        environment object built for every message, held by a job or not."""
        def settle(kept: bool) -> None:
            self._settle(kept, outcome, error)
        return settle

    def _settle(self, kept: bool, outcome: Outcome, error: BaseException | None) -> None:
        """The policy's later word on a job's latest finisher (called from another message's finish)."""
        ctx, hold, mt = self._ctx, self._tracer.hold, self._tracer
        if ctx is None or hold is None:
            return
        with mt._fate_lock:
            if not kept and self._must_keep:  # a kept victim was promised it while it was pending
                kept = True
                if mt.keep is not None:
                    mt.keep.kept_after_all(self._must_keep, was="superseded")
            self._fate = _KEPT if kept else _DROPPED
            if not kept:
                self._dropped_outcome = outcome
        hold.release(ctx.trace_id, kept)
        if kept and (self._process is not None or self._deferred is not None):
            try:
                self._write_spans(ctx, outcome, error)
            except Exception as exc:  # noqa: BLE001
                self._tracer.hook_failed("writing a kept trace", exc)

    def _materialize(self) -> DeferredSpan:
        """The process (and handler) span of a held trace, made now that it is kept."""
        held = self._deferred
        assert held is not None
        self._deferred = None
        creation = held.creation
        assert self._ctx is not None
        if creation is PARSE_IF_KEPT:
            creation = self._producer_context()  # a canonical traceparent: valid, its tracestate checked now
            if creation is not None and not creation.is_valid:
                creation = None
        # a root linked to the producer's context (its parent, the unrecorded send span, is not)
        links = (Link(creation),) if creation is not None else ()
        process = self._process = DeferredSpan(held.writer, held.name, self._ctx, None, held.pulled_ns,
                                               kind=_CONSUMER, attributes=dict(held.attrs), links=links)
        if not self._tracer.compact:
            self._handler = DeferredSpan(held.writer, n.HANDLER_SPAN, held.inner, self._ctx, held.start_ns)
        return process

    def _open_held(self, writer: SpanWriter, name: str, attrs: dict[str, Any], creation: Any, pulled_ns: int,
                   start_ns: int, base: otel_context.Context | None) -> otel_context.Context:
        """A new held trace, pending the keep decision (a root linked to ``creation``, the
        producer's context; a child of its unrecorded send span would be an orphan, see
        tracer.telemetry.keep): no live spans, no processor on_start. A sampled non-recording
        context with pre-allocated ids is current, so the user's spans are recorded (and held)
        under the handler id; ours are written with those ids at finish, if kept — the sampling
        attributes copied and the creation link made then."""
        hold = self._tracer.hold
        assert hold is not None
        ctx = self._ctx = hold.open_trace(writer.tracer.id_generator, running=True)  # not aged while it runs
        self._fate = _UNDECIDED
        inner = ctx if self._tracer.compact else writer.child_context(ctx)
        # tuple.__new__, not HeldSpans(...): the NamedTuple's Python __new__ is a call per held
        # message, measurable in `rmqtrace bench overhead`'s sampled_out loop
        self._deferred = tuple.__new__(HeldSpans, (writer, name, creation, pulled_ns, attrs, inner, start_ns))
        return trace.set_span_in_context(NonRecordingSpan(inner), base if base is not None else _get_current())

    def _write_spans(self, ctx: SpanContext, outcome: Outcome, error: BaseException | None,
                     c: Sequence[int] | None = None) -> None:
        """Write this trace's spans: the message path's (:class:`tracer.telemetry.tracer.MessageTrace`)."""
        raise NotImplementedError

    def _process_attributes(self, outcome: Outcome, span: DeferredSpan | None = None) -> dict[str, Any]:
        """The ``process`` attributes not given to the sampler at its start; with ``span``, put
        straight into its attributes (what ``put_attributes`` of them would do) and returned."""
        mt, carried = self._tracer, self._carried
        # by position: seven keywords cost a measurable part of a message (BENCHMARKS.md)
        return process_attributes(self.info, mt.client, outcome, self.stamps.times, carried.job_id, carried.cost,
                                  self.worker if mt.worker_attr else None, mt.record_body_size, self.body,
                                  mt.capture_body, span.own_attributes() if span is not None else None)
