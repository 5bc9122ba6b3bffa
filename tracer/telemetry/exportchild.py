"""Span export in a child process: the OTLP encoding and sending off the consumer's GIL.

:class:`ChildExportProcessor` is a span processor. ``on_end`` appends the finished span (already
written once, at its end) to a bounded in-process queue and returns; when the queue is full it
drops the span and counts it — it never waits, so a slow or dead backend never blocks a handler.
One thread (``rmqtrace-export-writer``) takes the queued spans in batches, turns each into a
plain tuple (:func:`span_record`) and writes the batch, ``marshal``-ed, to a child process's stdin;
the pipe write releases the GIL. The child (this module run as ``__main__`` by a ``python -c``
launcher) rebuilds the spans as SDK ``ReadableSpan`` objects and hands them to its exporters (the OTLP one by
default, built in the child from the same ``OTEL_*`` environment), then acknowledges the batch on
a pipe of its own (not its stdout, which is this process's: a console exporter prints where it
would in process): how many spans were exported and how many failed. A reader thread
(``rmqtrace-export-acks``) records the acknowledgements. The child runs in a session of its own and
ignores SIGINT and SIGTERM: a Ctrl-C or a service manager's stop reaches this process, whose clean
shutdown then flushes to a child still there; the child ends when its stdin ends.

Every span ``on_end`` accepted ends in exactly one of: ``exported`` (the child's exporter said
success), ``failed`` (the child's exporter said failure), ``lost`` (the child died, or could not be
started, while the span was on its way or unacknowledged: the whole unacknowledged batch counts,
even the part the child may have sent before it died) or, if :meth:`shutdown` runs out of time,
``lost`` too. Spans refused at a full queue or after shutdown are ``dropped``. Until then an accepted
span is ``queued`` or ``unacknowledged`` (taken by the writer: being encoded, in the pipe or in the
child), so every :meth:`~ChildExportProcessor.statistics` snapshot adds up: ``accepted = exported +
failed + lost + queued + unacknowledged``. Every one but the exported is also added to the
``drops`` counter (``rmqtrace_spans_dropped_total`` when built by
:func:`tracer.config.configure_tracing`). A dead child is logged (a warning per death) and
started again at the next batch, no sooner than ``restart_delay_s`` after the previous start. A
child that holds unacknowledged spans and acknowledges nothing for ``stall_timeout_s`` (default:
three times the OTLP export timeout the ``OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT`` environment gives,
at least 10 s — an exporter gives up on a batch within its timeout) is hung: it is killed and
counted as a dead one. The writer never blocks on the pipe for longer than it takes to see that.

A span whose values ``marshal`` refuses although the OTLP encoder takes them (an ``IntEnum`` or a
``str`` enum member: instances of subclasses of the wire types) is sent with those values as the
plain ints, strings and floats the encoder would have sent; a span that still cannot be encoded
fails alone, not its batch.

Frames on the child's stdin: a 4-byte big-endian length, then ``marshal.dumps((seq, resources,
scopes, records))``; length 0 (or the end of stdin) asks the child to flush, shut its exporters down
and exit. Lines on its acknowledgement pipe (the descriptor named on its command line):
``seq exported failed``.
"""

from __future__ import annotations

import enum
import importlib
import json
import logging
import marshal
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Mapping, Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from ..callables import require_plain
from ..logonce import OnceLogger
from .spanwire import attributes_record, plain, span_from_record, span_record

__all__ = ["ChildExportProcessor", "ChildExportStats", "ExportPhase", "child_main", "span_from_record", "span_record"]

log = logging.getLogger(__name__)

_LEN = struct.Struct(">I")
# SIGINT and SIGTERM ignored before the imports (a second of a loaded machine): a service manager's
# stop sent to every process of the group meanwhile must not kill the child the parent will flush to
_LAUNCH = ("import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); signal.signal(signal.SIGTERM, signal.SIG_IGN); "
           f"import runpy; runpy.run_module({__name__!r}, run_name='__main__', alter_sys=True)")
_READER_GRACE_S = 5.0  # a dead child's last acknowledgements take microseconds; a loaded machine, seconds
_MIN_STALL_S = 10.0  # a child starting on a loaded machine takes seconds to answer its first batch
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the directory holding the tracer package


class ExportPhase(enum.IntEnum):
    """Where a :class:`ChildExportProcessor`'s life stands. It only moves forward (a second
    ``shutdown`` leaves it where the first took it), under the processor's lock."""

    OPEN = 0  # on_end queues spans
    # shutdown() began: on_end drops; the writer writes what is queued, and its next child start
    # ignores restart_delay_s (the queue is flushed now, not a delay later)
    SHUTDOWN = 1
    FLUSHING = 2  # a child was started since shutdown began: a restart waits restart_delay_s again
    ABANDONED = 3  # shutdown's timeout passed: nothing more is written; what is queued is lost


_OPEN = ExportPhase.OPEN
_SHUTDOWN = ExportPhase.SHUTDOWN
_ABANDONED = ExportPhase.ABANDONED


@dataclass(frozen=True, slots=True)
class ChildExportStats:
    """What happened to the spans ``on_end`` saw (see the module doc); a frozen snapshot, with
    the processor's :class:`ExportPhase`."""

    accepted: int = 0
    dropped: int = 0
    exported: int = 0
    failed: int = 0
    lost: int = 0
    restarts: int = 0
    queued: int = 0
    unacknowledged: int = 0
    phase: ExportPhase = ExportPhase.OPEN


class _Child:
    """One running child: the process and its acknowledgements."""

    def __init__(self, proc: subprocess.Popen[bytes], acks: IO[bytes], now: float) -> None:
        self.proc = proc
        self.acks = acks  # the read end of the child's acknowledgement pipe
        self.inflight: dict[int, int] = {}  # seq -> spans, written and not yet acknowledged
        self.reader: threading.Thread | None = None
        self.progress = now  # last acknowledgement, or when unacknowledged spans appeared after none
        self.reaped = False  # its unacknowledged spans are counted lost: a late acknowledgement is ignored


class ChildExportProcessor(SpanProcessor):
    """Hands finished sampled spans to an exporter running in a child process (module doc).

    ``factory`` names the child's exporters as ``"module:function"``; the child calls
    ``function(**factory_args)`` and gets an exporter or a list of them (the default builds what
    ``OTEL_TRACES_EXPORTER`` and ``OTEL_EXPORTER_OTLP_*`` ask for, as
    :func:`tracer.config.make_exporters` does). ``env`` is the child's environment (default: this
    process's). ``drops`` is called with the number of every span not exported. The factory is
    resolved here (its module imported in this process too): one that cannot work is refused at
    once. ``stall_timeout_s``: how long a child holding unacknowledged spans may stay silent before
    it is killed as hung (module doc; None: from the OTLP timeout).
    """

    def __init__(self, factory: str = "tracer.config:child_exporters", factory_args: Mapping[str, Any] | None = None,
                 *, drops: Callable[[int], None] | None = None, max_queue_size: int = 2048,
                 max_batch_size: int = 512, interval_s: float = 0.2, restart_delay_s: float = 1.0,
                 env: Mapping[str, str] | None = None, stall_timeout_s: float | None = None) -> None:
        require_plain(drops, "ChildExportProcessor(drops=...)", optional=True)
        _resolve(factory)
        for name, value in (("max_queue_size", max_queue_size), ("max_batch_size", max_batch_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if not (isinstance(interval_s, (int, float)) and 0 < interval_s < 3600):  # 0: the writer would spin
            raise ValueError(f"interval_s must be seconds in (0, 3600), got {interval_s!r}")
        if not (isinstance(restart_delay_s, (int, float)) and 0 <= restart_delay_s < 3600):
            raise ValueError(f"restart_delay_s must be seconds in [0, 3600), got {restart_delay_s!r}")
        if stall_timeout_s is not None and not (
                isinstance(stall_timeout_s, (int, float)) and not isinstance(stall_timeout_s, bool)
                and 0 < stall_timeout_s < 86400):
            raise ValueError(f"stall_timeout_s must be seconds in (0, 86400) or None, got {stall_timeout_s!r}")
        self._spec = json.dumps({"factory": factory, "args": dict(factory_args or {})})
        self._drops = drops
        self._failures = OnceLogger("span export child", log)
        self.max_queue_size = max_queue_size
        self.max_batch_size = max_batch_size
        self.interval_s = float(interval_s)
        self._restart_delay = float(restart_delay_s)
        env = dict(os.environ if env is None else env)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        self._env = env
        self.stall_timeout_s = float(stall_timeout_s) if stall_timeout_s is not None else _stall_from_env(env)
        self._queue: deque[ReadableSpan] = deque()
        self._wake = threading.Event()
        self._lock = threading.Lock()  # the counters and the current child's inflight table
        self._acked = threading.Condition(self._lock)
        self._phase: ExportPhase = _OPEN  # moved only forward, by _shut_locked, _flush_started and _abandon
        self._seq = 0
        self._taken = 0  # spans the writer took from the queue
        self._in_hand = 0  # of those, being encoded: neither queued nor in a child's inflight table
        self._dropped = 0
        self._exported = 0
        self._failed = 0
        self._lost = 0
        self._restarts = 0
        self._child: _Child | None = None
        self._last_start = -float("inf")
        self._starting: tuple[int, ...] = ()  # the acknowledgement pipe while a child starts (fork: close it)
        self._deadline = float("inf")  # of the shutdown, on the monotonic clock
        self._flush_asked = 0
        self._flushed = 0
        self._writer = threading.Thread(target=self._run, name="rmqtrace-export-writer", daemon=True)
        self._writer.start()
        if hasattr(os, "register_at_fork"):  # a worker forked after set-up (gunicorn's preload) exports too
            method = weakref.WeakMethod(self._after_fork)
            os.register_at_fork(after_in_child=lambda: _call_if_alive(method))

    def _after_fork(self) -> None:
        """In a forked process: the parent's child, queue and threads are the parent's. Close
        this copy's ends of the parent's pipes (the parent's child must see the parent's EOF
        only), forget the spans queued before the fork (the parent exports them), start afresh."""
        inherited, self._child = self._child, None
        fds = list(self._starting)  # forked while the parent's writer was starting a child
        if inherited is not None:
            fds += [s.fileno() for s in (inherited.proc.stdin, inherited.acks) if s is not None and not s.closed]
        for fd in set(fds):
            try:
                os.close(fd)
            except OSError:
                pass
        self._starting = ()
        self._queue = deque()
        self._wake = threading.Event()
        self._lock = threading.Lock()  # a thread of the parent may have held it at the fork
        self._acked = threading.Condition(self._lock)
        self._failures = OnceLogger("span export child", log)  # its lock, too
        self._seq = self._taken = self._in_hand = self._dropped = self._exported = self._failed = self._lost = 0
        self._restarts = self._flush_asked = self._flushed = 0
        self._last_start = -float("inf")
        self._writer = threading.Thread(target=self._run, name="rmqtrace-export-writer", daemon=True)
        if self._phase is _OPEN:  # shut down before the fork: no writer, nothing to flush
            self._writer.start()

    # --- the consumer's side: never waits --------------------------------------------------

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        ctx = span.context
        if ctx is None or not ctx.trace_flags.sampled:
            return  # as the batch processor (and CountingSpanProcessor): only sampled spans are exported
        queue = self._queue
        # under the lock: the bound is exact, and no span slips in after shutdown counted the rest
        with self._lock:
            room = self._phase is _OPEN and len(queue) < self.max_queue_size
            if room:
                queue.append(span)
                wake = len(queue) >= self.max_batch_size
            else:
                self._dropped += 1
        if not room:
            self._count_drops(1)
        elif wake and not self._wake.is_set():
            self._wake.set()  # a lock and a notify: once per batch, not per span while the writer is busy

    # --- the writer thread ---------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            self._wake.wait(self.interval_s)
            self._wake.clear()
            closing = self._phase is not _OPEN
            try:
                self._pump()
            except Exception:  # noqa: BLE001 - a bug here must not end the export for the process's life
                log.exception("rmqtrace: the span export writer failed; it carries on")
            if closing:
                break
        self._stop_child()

    def _pump(self) -> None:
        """Write every queued span to the child, starting or restarting it as needed."""
        while self._phase is not _ABANDONED:
            self._reap_if_dead()
            with self._lock:
                asked = self._flush_asked
                empty = not self._queue
                if empty:
                    self._flushed = max(self._flushed, asked)
                    self._acked.notify_all()
            if empty:
                return
            child = self._ensure_child()
            if child is None:
                return  # not yet restartable: the queue keeps filling, and drops at its bound
            spans = self._take()
            try:
                payload, bad = self._payload(spans)
            except Exception:  # noqa: BLE001 - whatever a span holds, the writer lives on and counts it
                log.warning("rmqtrace: %d span(s) could not be encoded for the export child; counted as failed",
                            len(spans), exc_info=True)
                payload, bad = None, len(spans)
            with self._lock:
                self._in_hand = 0
                self._failed += bad
                if payload is not None:
                    if not child.inflight:
                        child.progress = time.monotonic()
                    child.inflight[payload[0]] = len(spans) - bad
            if bad:
                self._count_drops(bad)
            if payload is None:
                continue
            try:
                self._write(child, _LEN.pack(len(payload[1])) + payload[1])
            except OSError as exc:  # the child died (EPIPE), its stdin was closed by a stop, or it hung
                self._reap(child, str(exc) if isinstance(exc, _Hung) else "its stdin closed")

    def _take(self) -> list[ReadableSpan]:
        """Up to a batch of queued spans, counted taken in the same step (statistics add up)."""
        with self._lock:
            queue = self._queue
            if len(queue) <= self.max_batch_size:
                spans = list(queue)
                queue.clear()
            else:
                popleft = queue.popleft
                spans = [popleft() for _ in range(self.max_batch_size)]
            self._taken += len(spans)
            self._in_hand = len(spans)
        return spans

    def _payload(self, spans: list[ReadableSpan]) -> tuple[tuple[int, bytes] | None, int]:
        """``((seq, frame body), spans that could not be encoded)``; None when none could."""
        resources, scopes, records = self._encode(spans)
        with self._lock:
            self._seq += 1
            seq = self._seq
        try:
            return (seq, marshal.dumps((seq, resources, scopes, records))), 0
        except ValueError:  # values of subclasses of the wire types (an IntEnum): the encoder's plain values
            resources, scopes = plain(resources), plain(scopes)
            records = [plain(r) for r in records]
        try:
            return (seq, marshal.dumps((seq, resources, scopes, records))), 0
        except ValueError:  # still not: the spans that cannot be written fail, each alone
            good = []
            for r in records:
                try:
                    marshal.dumps(r)
                except ValueError:
                    continue
                good.append(r)
            bad = len(records) - len(good)
            log.warning("rmqtrace: %d span(s) hold values that cannot be sent to the export child; counted as "
                        "failed", bad)
            if not good:
                return None, bad
            return (seq, marshal.dumps((seq, resources, scopes, good))), bad

    def _write(self, child: _Child, data: bytes) -> None:
        """Write ``data`` to the child's stdin (non-blocking); between tries, look for a hung child."""
        assert child.proc.stdin is not None
        fd = child.proc.stdin.fileno()
        view = memoryview(data)
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        while view:
            try:
                view = view[os.write(fd, view):]
                continue
            except BlockingIOError:
                pass
            poller.poll(self.interval_s * 1000)
            if self._phase is _ABANDONED:
                raise BrokenPipeError("the shutdown stopped it")
            self._kill_if_hung(child)

    def _encode(self, spans: list[ReadableSpan]) -> tuple[list[Any], list[Any], list[Any]]:
        resources: dict[int, int] = {}
        scopes: dict[int, int] = {}
        resource_list: list[Any] = []
        scope_list: list[Any] = []
        records = []
        for span in spans:
            res = span.resource
            rix = resources.get(id(res))
            if rix is None:
                rix = resources[id(res)] = len(resource_list)
                resource_list.append((attributes_record(res.attributes), res.schema_url))
            scope = span.instrumentation_scope
            six = scopes.get(id(scope))
            if six is None:
                six = scopes[id(scope)] = len(scope_list)
                scope_list.append((scope.name, scope.version, scope.schema_url, attributes_record(scope.attributes))
                                  if scope is not None else None)
            records.append(span_record(span, rix, six))
        return resource_list, scope_list, records

    def _ensure_child(self) -> _Child | None:
        if self._child is not None or self._phase is _ABANDONED:
            return self._child
        now = time.monotonic()
        if now - self._last_start < self._restart_delay and self._phase is not _SHUTDOWN:
            return None
        self._flush_started()  # at shutdown, one start ignores the delay: the queue is flushed
        self._last_start = now
        ack_r = ack_w = -1
        try:
            ack_r, ack_w = os.pipe()
            self._starting = (ack_r, ack_w)
            # a session of its own: a terminal's Ctrl-C goes to this process, not to the child
            proc = subprocess.Popen([sys.executable, "-c", _LAUNCH, self._spec, str(ack_w)], stdin=subprocess.PIPE,
                                    env=self._env, pass_fds=(ack_w,), start_new_session=True)
        except OSError as exc:  # no descriptors, no memory, no interpreter: the next batch tries again
            self._starting = ()
            for fd in (ack_r, ack_w):
                if fd >= 0:
                    os.close(fd)
            log.warning("rmqtrace: the span export child could not start (%s); spans queue meanwhile, "
                        "up to %d, and drop beyond (counted)", exc, self.max_queue_size)
            return None
        self._starting = (ack_r,)  # first: a fork must never close a number this process closed already
        os.close(ack_w)  # the child holds the only write end: its death ends the reader's stream
        assert proc.stdin is not None
        os.set_blocking(proc.stdin.fileno(), False)  # the writer never waits on a child that hung
        child = _Child(proc, os.fdopen(ack_r, "rb"), now)
        child.reader = threading.Thread(target=self._read_acks, args=(child,), name="rmqtrace-export-acks",
                                        daemon=True)
        child.reader.start()
        self._child = child
        self._starting = ()
        return child

    def _read_acks(self, child: _Child) -> None:
        for line in child.acks:
            try:
                seq, ok, failed = (int(x) for x in line.split())
            except ValueError:
                continue
            with self._lock:
                if child.reaped:
                    return  # counted lost already (the reader was late): not exported twice over
                child.inflight.pop(seq, None)
                child.progress = time.monotonic()
                self._exported += ok
                self._failed += failed
                self._acked.notify_all()
            if failed:
                self._count_drops(failed)

    def _reap_if_dead(self) -> None:
        child = self._child
        if child is None:
            return
        try:
            self._kill_if_hung(child)
        except _Hung as exc:
            self._reap(child, str(exc))
            return
        if child.proc.poll() is not None:
            self._reap(child, f"exit status {child.proc.returncode}")

    def _kill_if_hung(self, child: _Child) -> None:
        """Kill ``child`` and raise :class:`_Hung` when it held unacknowledged spans and said nothing
        for ``stall_timeout_s``: an exporter gives up within its timeout, so this one never will."""
        with self._lock:
            silent = time.monotonic() - child.progress if child.inflight else 0.0
        if silent > self.stall_timeout_s:
            if child.proc.poll() is None:
                child.proc.kill()
            raise _Hung(f"no acknowledgement for {silent:.1f} s, stall_timeout_s {self.stall_timeout_s:g}: hung, killed")

    def _reap(self, child: _Child, why: str) -> None:
        """The child is gone: read its last acknowledgements, count the rest as lost, forget it."""
        if child.proc.poll() is None:
            child.proc.kill()
        child.proc.wait()
        if child.reader is not None:
            # the child is dead: its acknowledgements end at once, unless a process forked from ours
            # (no fork handler ran: a C extension's fork) holds the pipe's write end; then not wait for it
            child.reader.join(_READER_GRACE_S)
            if child.reader.is_alive():
                self._failures("acknowledgement reader", None, "a forked process holds the pipe; the reader is left")
        left_reading = child.reader is not None and child.reader.is_alive()
        for stream in (child.proc.stdin, None if left_reading else child.acks):  # a read holds its stream's lock
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        with self._lock:
            child.reaped = True
            lost = sum(child.inflight.values())
            child.inflight.clear()
            self._lost += lost
            if self._phase is _OPEN:
                self._restarts += 1
            self._acked.notify_all()
        self._child = None
        if lost:
            self._count_drops(lost)
        if self._phase is _OPEN:
            log.warning("rmqtrace: the span export child %d died (%s) with %d span(s) unacknowledged, counted "
                        "as lost; it is started again at the next batch", child.proc.pid, why, lost)
        elif lost:
            log.warning("rmqtrace: the span export child %d ended (%s) with %d span(s) unacknowledged, counted "
                        "as lost", child.proc.pid, why, lost)

    def _stop_child(self) -> None:
        """Ask the child to flush and exit (a zero-length frame), then count what it never acknowledged."""
        child = self._child
        if child is None:
            return
        stdin = child.proc.stdin
        assert stdin is not None
        try:
            os.write(stdin.fileno(), _LEN.pack(0))
        except OSError:
            pass  # the pipe is full (the end of stdin says the same) or the child is gone
        try:
            stdin.close()
        except OSError:
            pass
        try:
            child.proc.wait(max(0.0, self._deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("rmqtrace: the span export child did not finish before the shutdown's timeout; stopped")
        self._reap(child, "shutdown")

    # --- life cycle ---------------------------------------------------------------------------

    def _shut_locked(self) -> bool:
        """shutdown() begins: OPEN becomes SHUTDOWN. Whether this call did it (a later one returns)."""
        if self._phase is not _OPEN:
            return False
        self._phase = _SHUTDOWN
        return True

    def _flush_started(self) -> None:
        """The writer starts a child: after shutdown began, the one start that ignored the delay."""
        with self._lock:
            if self._phase is _SHUTDOWN:
                self._phase = ExportPhase.FLUSHING

    def _abandon(self) -> None:
        """shutdown's timeout passed: the writer writes nothing more."""
        with self._lock:
            self._phase = _ABANDONED

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Wait until every span queued before the call is acknowledged by the child (or counted lost)."""
        deadline = time.monotonic() + timeout_millis / 1000
        with self._lock:
            if self._phase is not _OPEN:
                return False
            self._flush_asked += 1
            ticket = self._flush_asked
        self._wake.set()
        with self._lock:
            while True:
                child = self._child
                done = self._flushed >= ticket and not (child is not None and child.inflight)
                left = deadline - time.monotonic()
                if done or left <= 0:
                    return done
                self._acked.wait(min(left, 0.05))
                if self._flushed < ticket:
                    self._wake.set()

    def shutdown(self, timeout_millis: int = 30000) -> None:
        """Write what is queued, let the child export it and exit; whatever is left then is lost, counted."""
        with self._lock:
            if not self._shut_locked():
                return
        self._deadline = time.monotonic() + max(0.0, timeout_millis / 1000)
        self._wake.set()
        self._writer.join(max(0.0, self._deadline - time.monotonic()))
        if self._writer.is_alive():
            # blocked writing to a child that stopped reading: stop it (the write then fails), and
            # count what is still queued as lost rather than start another child now
            self._abandon()
            child = self._child
            if child is not None:
                child.proc.kill()
            self._writer.join()
        with self._lock:
            left = len(self._queue)
            self._queue.clear()
            self._lost += left
            self._taken += left
        if left:
            self._count_drops(left)

    def _count_drops(self, n: int) -> None:
        """Tell ``drops`` about ``n`` spans not exported; a hook that raises costs only its own count
        (logged once): never the handler ending a span, the writer or the acknowledgement reader."""
        if self._drops is None:
            return
        try:
            self._drops(n)
        except Exception as exc:  # noqa: BLE001 - a user's counter must not stop the export
            self._failures("drops", exc)

    def statistics(self) -> ChildExportStats:
        with self._lock:
            child = self._child
            return ChildExportStats(
                accepted=self._taken + len(self._queue), dropped=self._dropped, exported=self._exported,
                failed=self._failed, lost=self._lost, restarts=self._restarts, queued=len(self._queue),
                unacknowledged=self._in_hand + (sum(child.inflight.values()) if child is not None else 0),
                phase=self._phase)

    @property
    def child_pid(self) -> int | None:
        """The running child's process id (None between a death and the restart)."""
        child = self._child
        return child.proc.pid if child is not None else None


class _Hung(OSError):
    """The child held unacknowledged spans and said nothing for ``stall_timeout_s`` (it is killed)."""


def _call_if_alive(method: weakref.WeakMethod[Callable[[], None]]) -> None:
    bound = method()
    if bound is not None:
        bound()


def _resolve(factory: str) -> Callable[..., Any]:
    """The callable ``"module:function"`` names (imported here), or a ValueError saying why it cannot work."""
    module, sep, name = factory.partition(":") if isinstance(factory, str) else ("", "", "")
    if not (sep and module and name):
        raise ValueError(f"factory must be 'module:function', got {factory!r}")
    try:
        made = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"factory {factory!r} cannot work: {exc}") from None
    if not callable(made):
        raise ValueError(f"factory {factory!r} cannot work: {name} is a {type(made).__name__}, not a callable")
    return made  # type: ignore[no-any-return]


def _stall_from_env(env: Mapping[str, str]) -> float:
    """Three OTLP export timeouts (the exporters' own reading of the environment), at least 10 s."""
    raw = env.get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") or env.get("OTEL_EXPORTER_OTLP_TIMEOUT") or "10"
    try:
        timeout = float(raw)
    except ValueError:
        timeout = 10.0  # the exporters fall back to their default, 10 s, too
    return max(_MIN_STALL_S, 3 * timeout) if timeout > 0 else _MIN_STALL_S


# --- the child ------------------------------------------------------------------------------------


def _read_exact(stream: IO[bytes], n: int) -> bytes | None:
    data = stream.read(n)
    return data if data is not None and len(data) == n else None


def _exporters(spec: Mapping[str, Any]) -> list[SpanExporter]:
    made = _resolve(str(spec["factory"]))(**spec.get("args", {}))
    return list(made) if isinstance(made, (list, tuple)) else [made]


def child_main(argv: Sequence[str] | None = None) -> int:
    """The child: read frames from stdin, export them, acknowledge on the pipe argv[1] names (module doc)."""
    args = list(sys.argv[1:] if argv is None else argv)
    for signum in (signal.SIGINT, signal.SIGTERM):  # the parent stops us, by the end of stdin, after its flush
        signal.signal(signum, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, format="rmqtrace export child: %(message)s")
    frames = sys.stdin.buffer
    ack_fd = int(args[1])
    os.set_inheritable(ack_fd, False)  # a process an exporter starts must not hold our parent's stream open
    acks = os.fdopen(ack_fd, "w", buffering=1)  # stdout stays the parent's: a console exporter prints there
    exporters = _exporters(json.loads(args[0]))
    resources: dict[Any, Resource] = {}
    scopes: dict[Any, InstrumentationScope] = {}
    while True:
        head = _read_exact(frames, _LEN.size)
        if head is None:
            break  # the parent is gone
        size = _LEN.unpack(head)[0]
        if size == 0:
            break
        body = _read_exact(frames, size)
        if body is None:
            break
        seq, resource_list, scope_list, records = marshal.loads(body)
        res = [resources.get(repr(r)) or resources.setdefault(repr(r), Resource(r[0], r[1])) for r in resource_list]
        scs = [None if s is None else scopes.get(repr(s)) or scopes.setdefault(
            repr(s), InstrumentationScope(s[0], s[1], s[2], s[3])) for s in scope_list]
        spans = [span_from_record(r, res, scs) for r in records]  # type: ignore[arg-type]
        ok = True
        for exporter in exporters:
            try:
                ok = exporter.export(spans) is SpanExportResult.SUCCESS and ok
            except Exception:  # noqa: BLE001 - an exporter that raises fails its batch, not the child
                log.warning("exporter %s raised", type(exporter).__name__, exc_info=True)
                ok = False
        acks.write(f"{seq} {len(spans) if ok else 0} {0 if ok else len(spans)}\n")
    for exporter in exporters:
        exporter.shutdown()
    acks.close()
    return 0


if __name__ == "__main__":
    sys.exit(child_main())
