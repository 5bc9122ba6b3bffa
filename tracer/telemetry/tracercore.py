"""What a :class:`~tracer.telemetry.tracer.MessageTracer` is built from, and its bookkeeping.

:class:`TracerCore` is the tracer without the message path: its constructor (assignments; the
environment comes in as one :class:`~tracer.telemetry.tracerconfig.TracerConfig`), the client it
describes, the span writer resolved on first use, the keep policy and hold, the runs whose lease was
lost, our own failures and :meth:`~TracerCore.statistics`. ``MessageTracer`` adds the message path
(:mod:`tracer.telemetry.tracer`); the two are one class, and share its private state.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Callable, Final, Mapping, Sequence

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanContext, SpanKind, TracerProvider

from ..bounds import count
from ..callables import require_plain
from ..compiled import mypyc_attr
from ..logonce import outside_stacklevel
from ..path import names as n
from ..path.clock import Anchor, Clock, MonoNs, WallNs, default_clock, require_clock
from ..path.message import ClientFacts, MessageInfo
from ..path.propagation import PLAUSIBLE_AHEAD_NS, PLAUSIBLE_MIN_NS, PropagationErrors, plausible_ns
from ..path.stages import Outcome, Stage
from ..path.stamps import SkewTracker, store_stamp
from ..version import __version__
from .abandon import HandlerAbandoned, watch_shutdown
from .adopt import keep_for
from .attributes import cap, process_sampling_attributes, server_attributes
from .hold import HoldingSpanProcessor, HoldStats
from .keep import KeepPolicy, KeepStats
from .metrics import TracerMetrics
from .occupancy import Occupancy
from .otel_metrics import GLOBAL_METERS, MessagingMeters
from .spans import SpanWriter, span_writer
from .tracephase import TracePhase
from .tracerconfig import TracerConfig

__all__ = ["LOOSE_CLIENT_KEYWORDS", "TracerCore", "TracerStats", "client_facts"]

log = logging.getLogger(__name__)

# Runs whose lease was lost, remembered (by message id) for the redelivery's link: the broker
# redelivers within a lease or two, so a few hundred cover any burst; the oldest go first.
_MAX_LOST_RUNS: Final = 512
# Topics (with their endpoint) whose process span name and sampling attributes are kept built.
_MAX_STARTS: Final = 256
_OPEN: Final = TracePhase.OPEN
_PRODUCE: Final = int(Stage.PRODUCE)
_STORE: Final = int(Stage.BROKER_STORE)
_PULL: Final = int(Stage.CLIENT_PULL)
# The keywords `client=` replaced, each a field of ClientFacts (deprecated, still honoured).
LOOSE_CLIENT_KEYWORDS: tuple[str, ...] = ClientFacts._fields

# What a finished trace's listener is called with: the MessageTrace (tracer.telemetry.tracer) and its outcome.
# Its answer is ignored (a coroutine's closed): typed ``object``, which a compiled build
# (tracer.compiled) does not check, where ``None`` refused a coroutine before it could be closed.
Listener = Callable[[Any, Outcome], object]


def client_facts(client: ClientFacts | None, **loose: Any) -> ClientFacts:
    """``client`` with the deprecated loose keywords (``client_id=`` ...) that were given laid over it.

    Raises:
        ValueError: a ``server_port`` that is not a TCP port.
    """
    given = {k: v for k, v in loose.items() if v is not None}
    if given:
        warnings.warn(f"MessageTracer({'=, '.join(given)}=) is deprecated: pass client=ClientFacts(...) "
                      "(tracer.path.message.ClientFacts)", DeprecationWarning, stacklevel=outside_stacklevel())
    facts = (client or ClientFacts())._replace(**given)
    port = facts.server_port
    if port is not None and not (isinstance(port, int) and 0 < port < 65536):
        raise ValueError(f"server_port must be a TCP port (1..65535), not {port!r}")
    return facts


def _keep_and_hold(keep: KeepPolicy | None, hold: HoldingSpanProcessor | None, provider: TracerProvider | None,
                   config: TracerConfig) -> tuple[KeepPolicy | None, HoldingSpanProcessor | None, bool]:
    """The keep policy and hold a tracer starts with (the hold settling the policy), and whether
    ``config``'s ``RMQTRACE_KEEP_*`` is still to be applied (no ``keep=``/``hold=`` and the global
    provider is not set yet: then :meth:`TracerCore.writer` applies it to the one set by then).

    Raises:
        ValueError: ``keep`` without ``hold``; a ``RMQTRACE_KEEP_*`` value that cannot work.
    """
    if keep is None and hold is None:
        # for the provider we write into: the one configure_tracing built, or one
        # opentelemetry-instrument set up (see telemetry.adopt)
        target = provider if provider is not None else trace.get_tracer_provider()
        if isinstance(target, trace.ProxyTracerProvider):
            return None, None, True  # decided once the real one is set
        found = keep_for(target, config.keep_env)
        if found is None:
            return None, None, False
        keep, hold = found
    if keep is not None and hold is None:
        raise ValueError("keep= needs hold=, the HoldingSpanProcessor on the tracer provider: without it "
                         "the handler's spans of dropped messages would still be exported")
    if keep is not None and hold is not None:
        hold.attach(keep)  # settled by time and at the provider's force_flush/shutdown
    return keep, hold, False


# A Python class even when compiled (tracer.compiled): MessageTracer, a Python class, derives from it
@mypyc_attr(native_class=False)
class TracerCore:
    """The constructor and bookkeeping of :class:`~tracer.telemetry.tracer.MessageTracer`."""

    def __init__(
        self,
        *,
        consumer_group: str = "",
        tracer_provider: TracerProvider | None = None,
        metrics: TracerMetrics | None = None,
        clock: Clock | None = None,
        worker_attr: bool = True,
        listeners: Sequence[Callable[[Any, Outcome], object]] = (),  # a MessageTrace and its outcome
        capture_body: int | float = 0,  # an int; also float: compiled, an int parameter takes True as 1
        occupancy: Occupancy | None = None,
        client: ClientFacts | None = None,
        client_id: str | None = None,
        namespace: str | None = None,
        server_address: str | None = None,
        server_port: int | None = None,
        record_body_size: bool = False,
        trace_shape: str | None = None,
        keep: KeepPolicy | None = None,
        hold: HoldingSpanProcessor | None = None,
        config: TracerConfig | None = None,
    ) -> None:
        # the arguments checked first: keep_for may adopt the provider
        self.config = _config(config, trace_shape)
        self.compact = self.config.compact  # read per message
        self._set_client(client_facts(client, client_id=client_id, namespace=namespace,
                                      server_address=server_address, server_port=server_port))
        self.clock = _clock(clock)
        self.capture_body = max(0, count(capture_body, "capture_body", minimum=-(2**63)))  # below 0: off
        self.listeners = _listeners(listeners)  # told of every finished message (the demo's stamps)
        self.consumer_group = consumer_group
        self.record_body_size = bool(record_body_size)
        self.worker_attr = worker_attr
        self.occupancy = occupancy  # fed from the stamps: pulled = received, handler start/end = a worker busy
        self.metrics = metrics
        self.meters: MessagingMeters = GLOBAL_METERS  # OTel metrics: the global MeterProvider's
        self.errors = PropagationErrors(metrics.count_propagation_error if metrics else None)
        self.skew = SkewTracker()
        # Head-dropped messages get a held trace of their own, kept or dropped at finish (keep.py).
        self.keep, self.hold, self._keep_from_env = _keep_and_hold(keep, hold, tracer_provider, self.config)
        self._share_clock()
        self._provider = tracer_provider
        self.tracer = trace.get_tracer("rmqtrace", __version__, tracer_provider=tracer_provider, schema_url=n.SCHEMA_URL)
        self._writer: SpanWriter | None = None
        self._writer_resolved = False
        self.foreign_provider = False  # records, not the SDK (a vendor's): no spans of ours, the context still current
        self._hook_failures: dict[str, int] = {}
        self._hook_lock = threading.Lock()
        # Orders a handler's end (worker thread) against a watchdog's finish (another thread).
        self._end_lock = threading.Lock()
        # message id -> the process span context of a run whose lease was lost (see MessageTrace.lease_lost)
        self._lost_runs: OrderedDict[str, SpanContext] = OrderedDict()
        self._lost_lock = threading.Lock()
        self._abandonable: set[Any] = set()  # handlers entered, not exited: what a shutdown abandons (_end_lock)
        self._fate_lock = threading.Lock()  # a held MessageTrace's _fate and _must_keep (blame-aware keep)

    def _set_client(self, facts: ClientFacts) -> None:
        self.client: ClientFacts = facts  # read by the attributes, and by telemetry.operations
        self._server = server_attributes(facts)
        # the topic (with the endpoint, when the message names one) -> the process span's name and what the sampler
        # sees; built once per topic (the sampler gets the same read-only dict every time)
        self._starts: dict[Any, tuple[str, dict[str, Any]]] = {}

    @property
    def client_id(self) -> str | None:
        return self.client.client_id

    @property
    def namespace(self) -> str | None:
        return self.client.namespace

    def describe_client(self, facts: ClientFacts) -> None:
        """Fill what was not given at construction from a client's own facts (the wrappers call
        this with :func:`tracer.path.message.client_facts` of the client they wrap)."""
        c = self.client
        has_server = bool(c.server_address)
        self._set_client(ClientFacts(
            c.client_id if c.client_id is not None or not facts.client_id else facts.client_id,
            c.namespace if c.namespace is not None else facts.namespace,
            c.server_address if has_server else facts.server_address,
            c.server_port if has_server else facts.server_port))

    def process_sampling_attributes(self, info: MessageInfo) -> dict[str, Any]:
        """What the sampler sees when it decides a ``process`` span (the spec's sampling-relevant set)."""
        return process_sampling_attributes(info, self.consumer_group, self._server)

    def process_start(self, info: MessageInfo) -> tuple[str, dict[str, Any]]:
        """The ``process`` span's name and sampling attributes (not to be changed: they are shared)."""
        # keyed by the topic alone when the message names no endpoint (the common case, no tuple)
        key: Any = info.topic if info.server_address is None else (info.topic, info.server_address, info.server_port)
        starts = self._starts
        found = starts.get(key)
        if found is None:
            found = (n.process_span_name(cap(info.topic)), self.process_sampling_attributes(info))
            if len(starts) < _MAX_STARTS:  # topics on the fly are built per message past this
                starts[key] = found
        return found

    def statistics(self) -> TracerStats:
        """A frozen snapshot: our own failures by place, propagation errors, skew, keep and hold."""
        with self._hook_lock:
            hooks = dict(self._hook_failures)
        return TracerStats(hooks, dict(self.errors.counts), self.skew.bounds(),
                           self.keep.statistics() if self.keep is not None else None,
                           self.hold.statistics() if self.hold is not None else None)

    def start_span_at(self, name: str, kind: SpanKind, parent_ctx: Context, start_ns: int,
                      attributes: dict[str, Any], links: Sequence[Link] = ()) -> Span:
        """The span ``Tracer.start_span`` would start under ``parent_ctx`` at ``start_ns``, not made
        current. On the SDK it is written once when it ends
        (:meth:`~tracer.telemetry.spans.SpanWriter.start`: no SDK span lock or per-link attribute
        copy, BENCHMARKS.md); any other provider starts its own. The send, receive and settle spans
        are begun here."""
        writer = self.writer()
        if writer is None:
            return self.tracer.start_span(name, context=parent_ctx, kind=kind, attributes=attributes,
                                          links=links, start_time=start_ns)
        return writer.start(name, kind, parent_ctx, start_ns, attributes, links)

    def writer(self) -> SpanWriter | None:
        """The span writer for the SDK provider, resolved on first use (the global provider may
        be installed after this tracer was built, e.g. by ``opentelemetry-instrument``)."""
        if self._writer_resolved:
            return self._writer
        provider = self._provider or trace.get_tracer_provider()
        self._writer = span_writer(provider.get_tracer("rmqtrace", __version__))
        self._writer_resolved = not isinstance(provider, trace.ProxyTracerProvider)
        if self._writer_resolved and self._keep_from_env:
            self._keep_from_env = False
            self._adopt_keep(provider)
        if self._writer is not None and self._writer_resolved:
            # after keep_for: in front of an adopted hold, so the spans it ends still reach it
            watch_shutdown(provider, self)
        self.foreign_provider = self._writer is None and not isinstance(
            provider, (trace.NoOpTracerProvider, trace.ProxyTracerProvider))
        return self._writer

    def _adopt_keep(self, provider: Any) -> None:
        """The configuration's ``RMQTRACE_KEEP_*`` for the provider set after construction."""
        try:
            found = keep_for(provider, self.config.keep_env)
        except ValueError as exc:  # a bad RMQTRACE_KEEP_* found this late: say it, trace on
            self.hook_failed("reading RMQTRACE_KEEP_*", exc)
            found = None
        if found is not None:
            keep, hold = self.keep, self.hold = found
            hold.attach(keep)
            try:
                self._share_clock()
            except ValueError as exc:  # another tracer's clock took the hold first: say it, trace on
                self.hook_failed("sharing the clock with RMQTRACE_KEEP_*", exc)

    def _share_clock(self) -> None:
        """The keep policy's and the hold's timers on this tracer's monotonic clock: the times a
        finish hands them are read on it (one source for stamps, blame, hold and keep)."""
        if self.keep is not None:
            self.keep.share_clock(self.clock)
        if self.hold is not None:
            self.hold.share_clock(self.clock)
        if self.occupancy is not None:
            self.occupancy.share_clock(self.clock)

    def abandon_handlers(self) -> int:
        """End the handler span of every handler still running (status ERROR,
        ``rmqtrace.abandoned``), so the user's spans under it are not orphans; how many. Run at the
        provider's shutdown (:mod:`tracer.telemetry.abandon`); a dispatcher's ``close`` does it for
        its own overrun handlers (:meth:`MessageTrace.abandon`). A running handler whose message
        was not finished yet (no ``handler_timeout``, or none reported) is finished first, as a
        ``timeout`` with :class:`~tracer.telemetry.abandon.HandlerAbandoned`: it ran past the
        time it was given (the process ends under it), so it is measured once and its
        ``process`` span written with the handler's — after the keep policy has settled every
        pending trace (kept), so such a finish supersedes none."""
        with self._end_lock:
            traces = list(self._abandonable)
        if self.keep is not None and any(t.phase is _OPEN for t in traces):
            # The shutdown keeps every pending trace (the hold's promise): settled before these
            # finishes, which would make a running handler its job's latest finisher and drop
            # the finisher pending now as superseded.
            self.keep.flush()
        n_ended = 0
        for t in traces:
            if t.phase is _OPEN:
                t.finish(Outcome.TIMEOUT, HandlerAbandoned("the handler still ran when the tracer provider shut down"))
            n_ended += t.abandon()
        return n_ended

    def _take_lost_run(self, message_id: str, ctx: SpanContext) -> None:
        """A copy of ``message_id`` ran: the lost run it links to is linked (forget it, if still ``ctx``)."""
        with self._lost_lock:
            if self._lost_runs.get(message_id) == ctx:
                del self._lost_runs[message_id]

    def lost_run(self, message_id: str) -> SpanContext | None:
        """The ``process`` context of a run of ``message_id`` whose lease was lost, while it is
        remembered for its redelivery's link (:meth:`MessageTrace.lease_lost`)."""
        with self._lost_lock:
            return self._lost_runs.get(message_id)

    def _remember_lost_run(self, message_id: str, ctx: SpanContext) -> None:
        with self._lost_lock:
            runs = self._lost_runs
            runs[message_id] = ctx
            runs.move_to_end(message_id)
            while len(runs) > _MAX_LOST_RUNS:
                runs.popitem(last=False)

    def _pull_anchor(self, pulled_ns: Anchor | int | None, now: WallNs, mono: MonoNs) -> Anchor:
        """The message's timeline, anchored at its pull (see :meth:`start_message`'s ``pulled_ns``)."""
        clock = self.clock
        if isinstance(pulled_ns, Anchor):
            if pulled_ns.read_on(clock):  # the batch's pull, read on both clocks at once
                return Anchor(clock, pulled_ns.wall_ns, pulled_ns.mono_ns)
            pulled_ns = pulled_ns.wall_ns  # read on another clock: only its wall time means anything here
        if pulled_ns and not plausible_ns(pulled_ns, now):
            self.errors.count("timestamp_out_of_range", f"pulled_ns={pulled_ns}")
            pulled_ns = None
        if pulled_ns:
            # a wall time read elsewhere (a client's decode): that far back on the monotonic clock,
            # never ahead of now (the wall clock stepped back in between)
            since = now - pulled_ns
            return Anchor(clock, WallNs(pulled_ns), MonoNs(mono - since if since > 0 else mono))
        return Anchor(clock, now, mono)

    def _stamp_received(self, times: list[int], produce_ns: int, pulled: int, store_ms: int | None, now: int) -> None:
        """The three stamps a message has when it is received: produce, broker store, client pull."""
        times[_PRODUCE] = produce_ns
        times[_PULL] = pulled
        if store_ms:
            if PLAUSIBLE_MIN_NS <= store_ms * 1_000_000 <= now + PLAUSIBLE_AHEAD_NS:  # plausible_ns, inline
                # millisecond resolution: placed within its millisecond (tracer.path.stamps)
                times[_STORE] = store_stamp(store_ms, produce_ns, pulled)
            else:
                self.errors.count("timestamp_out_of_range", f"store_ms={store_ms}")

    def hook_failed(self, where: str, exc: BaseException) -> None:
        """Log a failure of our own code once per place; the user's message flow goes on."""
        with self._hook_lock:
            first = where not in self._hook_failures
            self._hook_failures[where] = self._hook_failures.get(where, 0) + 1
        if first:
            log.error("rmqtrace: %s failed; tracing for it is skipped (logged once)", where, exc_info=exc)


def _clock(clock: Clock | None) -> Clock:
    """``clock``, checked; None: the system clock.

    Raises:
        TypeError: ``clock`` lacks ``wall_ns()`` or ``monotonic_ns()``.
    """
    if clock is None:
        return default_clock()
    require_clock(clock, "MessageTracer(clock=)", wall=True, monotonic=True)
    return clock


def _listeners(listeners: Sequence[Listener]) -> list[Listener]:
    """The listeners, each a plain callable.

    Raises:
        TypeError: one is not callable, or calling it would not run it (``async def``, a generator).
    """
    for fn in listeners:
        require_plain(fn, "listeners[]")
    return list(listeners)


def _config(config: TracerConfig | None, trace_shape: str | None) -> TracerConfig:
    """``config`` (default: read from the environment now, once), ``trace_shape`` winning over its shape.

    Raises:
        ValueError: an unknown trace shape.
    """
    if config is None:
        return TracerConfig.from_env(trace_shape=trace_shape)
    return config if trace_shape is None else replace(config, trace_shape=trace_shape)


@dataclass(frozen=True, slots=True)
class TracerStats:
    """What one :class:`MessageTracer` has seen (:meth:`MessageTracer.statistics`)."""

    hook_failures: Mapping[str, int]  # our own code's failures, by place (the first of each is logged)
    propagation_errors: Mapping[str, int]  # bad trace context or stamps in received messages, by kind
    skew_bounds_ns: Mapping[str, int]  # per clock pair, the smallest cross-clock gap of the recent messages
    keep: KeepStats | None
    hold: HoldStats | None
