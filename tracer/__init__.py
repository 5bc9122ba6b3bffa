"""rmqtrace: stamps on every RocketMQ message, turned into spans and histograms per stage gap.

The data path, top to bottom: :mod:`tracer.stages` (what is stamped) → :mod:`tracer.stamps`
(gap arithmetic) → :mod:`tracer.propagation` (what travels in message properties) →
:mod:`tracer.telemetry` (spans and histograms) → :mod:`tracer.producer` / :mod:`tracer.consume`
(the seams) → :mod:`tracer.dispatch` (who runs the message, and how long it waited).
"""

from .path.clock import ManualClock, MonotonicWallClock
from .config import Settings, configure_tracing
from .clients.consume import ConsumeLoop, ConsumeStats
from .dispatch import AsyncDispatcher, Dispatcher, DispatchMetrics
from .path.message import MessageInfo, describe
from .telemetry.metrics import TracerMetrics
from .clients.producer import TracedProducer
from .path.stages import GAPS, Gap, Outcome, Stage
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
    "MonotonicWallClock",
    "Outcome",
    "Settings",
    "Stage",
    "TracedProducer",
    "TracerMetrics",
    "__version__",
    "configure_tracing",
    "describe",
]
