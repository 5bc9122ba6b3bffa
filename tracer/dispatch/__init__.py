"""The dispatcher: hand received messages to workers under a policy, and measure the wait.

See ``docs/dispatch.md``. Thread engine: :class:`Dispatcher`; asyncio: :class:`AsyncDispatcher`.
"""

from __future__ import annotations

from ..callables import HandlerNeverRan
from .aio import AsyncDispatcher
from .cost import job_priorities, longest_first, table_cost
from .costtable import CostTable, CostTableError, learn_costs, load_costs
from .engine import Dispatcher
from .metrics import DEFAULT_BUCKETS, BoundDispatchMetrics, DispatchMetrics
from .policy import (
    POLICY_NAMES,
    Aggressive,
    CostAware,
    Policy,
    Random,
    RoundRobin,
    resolve_policy,
)
from .protocol import DispatcherClosed, DispatchPhase, DispatchStats, HandlerTimeout, MessageTraceLike, NotStarted

__all__ = [
    "DEFAULT_BUCKETS",
    "POLICY_NAMES",
    "Aggressive",
    "AsyncDispatcher",
    "BoundDispatchMetrics",
    "CostAware",
    "CostTable",
    "CostTableError",
    "DispatchMetrics",
    "DispatchPhase",
    "DispatchStats",
    "Dispatcher",
    "DispatcherClosed",
    "HandlerNeverRan",
    "HandlerTimeout",
    "MessageTraceLike",
    "NotStarted",
    "Policy",
    "Random",
    "RoundRobin",
    "job_priorities",
    "learn_costs",
    "load_costs",
    "longest_first",
    "resolve_policy",
    "table_cost",
]
