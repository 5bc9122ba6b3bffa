"""rmqtrace: stamps on every RocketMQ message, turned into spans and histograms per stage gap.

The folders follow the data path, and each imports only from those above it in this list
(``tests/test_layers.py`` fails on an upward import):

* :mod:`tracer.path` — what is stamped and what travels: stages and gaps, stamps, clocks,
  message properties, attribute names;
* :mod:`tracer.telemetry` — stamps become spans and histograms; the span file;
  :mod:`tracer.config` (one-call SDK setup) sits on it;
* :mod:`tracer.dispatch` — who runs the message, and how long it waited for a worker;
* :mod:`tracer.clients` — the seams: traced producer, consume loop, the 5.x and 2.x clients,
  the ``opentelemetry-instrument`` instrumentor (:mod:`tracer.instrumentor` is its documented
  import path);
* :mod:`tracer.report` — reading spans back: terminal, HTML, PNG;
* :mod:`tracer.tools` — the ``rmqtrace`` command, demo and benchmarks (the library never imports it).

Below them all: small leaf modules (``version``, ``callables``, ``logonce``, ``argtypes``, ``bounds``,
``environ``: the one reader of the ``RMQTRACE_*``/``OTEL_*`` variables) and
:mod:`tracer.embedded` (an in-process broker, a test double of the proxy, importing nothing of ours).
"""

from .clients.consume import ConsumeLoop, ConsumeStats
from .clients.producer import TracedProducer
from .config import Settings, configure_tracing
from .dispatch import AsyncDispatcher, Dispatcher, DispatchMetrics
from .path.clock import ManualClock, SystemClock
from .path.message import MessageInfo, describe
from .path.stages import GAPS, Gap, Outcome, Stage
from .telemetry.metrics import TracerMetrics
from .telemetry.tracer import MessageTrace, MessageTracer
from .version import __version__

__all__ = [
    "GAPS",
    "AsyncDispatcher",
    "ConsumeLoop",
    "ConsumeStats",
    "DispatchMetrics",
    "Dispatcher",
    "Gap",
    "ManualClock",
    "MessageInfo",
    "MessageTrace",
    "MessageTracer",
    "Outcome",
    "Settings",
    "Stage",
    "SystemClock",
    "TracedProducer",
    "TracerMetrics",
    "__version__",
    "configure_tracing",
    "describe",
]
