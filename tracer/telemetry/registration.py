"""One way onto a Prometheus registry for every rmqtrace collector, and what multiprocess mode needs.

:class:`OnePerRegistry` is the base of every collector class rmqtrace registers
(``TracerMetrics``, ``DispatchMetrics``, ``OccupancyMetrics``, ``ProbeMetrics``;
``tests/test_collectors.py`` finds them all and checks each): a registry holds at most one
instance of each, a second is refused with one clear error *before* anything is registered, and
registration is all-or-nothing. The registry's own name check is not enough on its own: a custom
collector whose ``describe()`` is empty registers twice without complaint and then every scrape
fails ("Clashing name"), so the base also refuses a collector that describes no series.

Prometheus multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``): values must reach the directory's
files. :class:`Refresher` writes scrape-time values (gauges computed from live objects, integrals
that grow with time) into stock multiprocess metrics every ``interval`` seconds, and
:class:`SharedAdmission` makes a label cap hold across the processes writing to one directory.
"""

from __future__ import annotations

import atexit
import fcntl
import logging
import os
import threading
import weakref
from typing import Any, Callable, Sequence, TypeVar

from prometheus_client import REGISTRY as DEFAULT_REGISTRY
from prometheus_client import CollectorRegistry

__all__ = ["OnePerRegistry", "Refresher", "SharedAdmission", "multiprocess_dir"]

log = logging.getLogger(__name__)

_shared_lock = threading.Lock()


def multiprocess_dir() -> str | None:
    """``PROMETHEUS_MULTIPROC_DIR`` (or the older lower-case spelling), as prometheus-client reads it."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or os.environ.get("prometheus_multiproc_dir") or None


def _described(collector: Any) -> list[str]:
    describe = getattr(collector, "describe", None)
    return [m.name for m in describe()] if describe is not None else []


class OnePerRegistry:
    """A set of series that a registry holds at most once: all-or-nothing registration,
    :meth:`shared` (the registry's one instance) and :meth:`unregister`.

    Subclasses build their collectors unregistered and hand them to :meth:`_register`.
    """

    registry: CollectorRegistry
    _collectors: Sequence[Any]
    _instances: weakref.WeakKeyDictionary[CollectorRegistry, Any]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._instances = weakref.WeakKeyDictionary()

    @classmethod
    def _refusal(cls, detail: str) -> ValueError:
        name = cls.__name__
        return ValueError(f"this registry already holds rmqtrace's {name} series ({detail}); "
                          f"build {name} once per registry or use {name}.shared(registry)")

    def _register(self, registry: CollectorRegistry, collectors: Sequence[Any]) -> None:
        cls = type(self)
        for c in collectors:
            if not _described(c):
                # the registry could not refuse a clash with it: every scrape would fail instead
                raise TypeError(f"{cls.__name__}: collector {type(c).__name__} describes no series")
        with _shared_lock:
            held = cls._instances.get(registry)
        if held is not None:
            raise cls._refusal(f"another {cls.__name__} is registered")
        done: list[Any] = []
        try:
            for c in collectors:
                registry.register(c)
                done.append(c)
        except ValueError as exc:
            for c in done:
                registry.unregister(c)
            raise cls._refusal(str(exc)) from exc
        self.registry, self._collectors = registry, collectors
        with _shared_lock:
            cls._instances.setdefault(registry, self)

    @property
    def collectors(self) -> tuple[Any, ...]:
        """What this set registered, in order: each describes its series (tests find every family here)."""
        return tuple(self._collectors)

    @classmethod
    def shared(cls: type[_Self], registry: CollectorRegistry | None = None) -> _Self:
        """The one instance of a registry: the first one built on it, or a new one (defaults)."""
        reg = DEFAULT_REGISTRY if registry is None else registry
        with _shared_lock:
            found = cls._instances.get(reg)
        if found is not None:
            return found  # type: ignore[no-any-return]
        try:
            return cls(reg)  # type: ignore[call-arg]
        except ValueError:
            with _shared_lock:  # another thread built it meanwhile
                found = cls._instances.get(reg)
            if found is None:
                raise
            return found  # type: ignore[no-any-return]

    def unregister(self) -> None:
        """Take these series off the registry (e.g. before building another set on it); a
        multiprocess refresher stops writing them."""
        refresher = getattr(self, "_refresher", None)
        if isinstance(refresher, Refresher):
            refresher.stop()
        for c in self._collectors:
            try:
                self.registry.unregister(c)
            except KeyError:
                pass
        with _shared_lock:
            if type(self)._instances.get(self.registry) is self:
                del type(self)._instances[self.registry]


_Self = TypeVar("_Self", bound=OnePerRegistry)


_exiting_lock = threading.Lock()
_at_exit: weakref.WeakSet[Refresher] = weakref.WeakSet()
_exit_hooked = False


def _flush_at_exit() -> None:
    with _exiting_lock:
        refreshers = list(_at_exit)
    for r in refreshers:
        r.flush_now()


def _flush_me_at_exit(refresher: Refresher) -> None:
    global _exit_hooked
    with _exiting_lock:
        _at_exit.add(refresher)
        if not _exit_hooked:  # on first use, not at import
            atexit.register(_flush_at_exit)
            _exit_hooked = True


class Refresher:
    """Calls ``flush`` of an owner every ``interval`` seconds on a daemon thread, as long as the
    owner lives (held weakly: a dropped collector stops its thread), and once more at the
    interpreter's exit (``atexit``): a process's last interval is not lost with it, and one that
    lived less than ``interval`` is counted at all."""

    def __init__(self, owner: Any, flush: Callable[[Any], None], interval: float) -> None:
        if not interval > 0:
            raise ValueError(f"refresh interval must be positive, got {interval!r}")
        self._owner = weakref.ref(owner)
        self._flush = flush
        self._interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="rmqtrace-metrics-refresh", daemon=True)
                self._thread.start()
        _flush_me_at_exit(self)

    def stop(self) -> None:
        self._stop.set()
        with _exiting_lock:
            _at_exit.discard(self)

    def flush_now(self) -> None:
        """One flush now, in this thread (at exit, or when the owner's state just changed);
        a failed write is swallowed like the thread's."""
        owner = self._owner()
        if owner is None or self._stop.is_set():
            return
        try:
            self._flush(owner)
        except Exception:  # noqa: BLE001
            pass

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            owner = self._owner()
            if owner is None:
                return
            try:
                self._flush(owner)
            except Exception:  # noqa: BLE001 - a failed write is retried on the next tick
                pass
            del owner


class SharedAdmission:
    """The first ``limit`` distinct keys admitted by any process writing to one multiprocess
    directory: a label cap that holds in the aggregate, not per process.

    Admitted keys are lines of ``<dir>/rmqtrace_<name>.admitted`` (``MultiProcessCollector``
    reads only ``*.db``), appended under an exclusive ``flock``. Admitted keys are cached (a set
    read on the hot path); a new key costs one locked read of the file until it is full, and
    nothing after that (the file never changes again).
    """

    def __init__(self, directory: str, name: str, limit: int) -> None:
        self.path = os.path.join(directory, f"rmqtrace_{name}.admitted")
        self.limit = limit
        self._admitted: set[str] = set()  # at most `limit` keys: refusals are not remembered
        self._full = False  # the file holds `limit` keys: it never changes again
        self._warned = False
        self._lock = threading.Lock()

    def __call__(self, key: str) -> bool:
        line = key.replace("\\", "\\\\").replace("\n", "\\n")
        if line in self._admitted:
            return True
        if self._full:
            return False
        with self._lock:
            try:
                return self._ask(line)
            except OSError as exc:
                # the directory is gone or read-only: the cap still holds, per process
                if not self._warned:
                    self._warned = True
                    log.warning("rmqtrace: cannot share a label cap through %s (%s); it now holds per process",
                                self.path, exc)
                if len(self._admitted) >= self.limit:
                    return False
                self._admitted.add(line)
                return True

    def _ask(self, line: str) -> bool:
        with open(self.path, "a+", encoding="utf-8") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                f.seek(0)
                self._admitted.update(f.read().splitlines())
                if line in self._admitted:
                    return True
                if len(self._admitted) >= self.limit:
                    self._full = True
                    return False
                f.write(line + "\n")
                f.flush()
                self._admitted.add(line)
                return True
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
