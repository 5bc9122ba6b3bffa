"""``rmqtrace report … --costs costs.json``: the cost table learned from the messages read.

Each message key's cost is the median handler time of its deliveries whose handler ran (every
outcome: a failing test-case group still took that long; a timed-out one is recorded at its
deadline, a lower bound, which still sorts it among the longest), keyed by the message's first
recorded key (``MessageRecord.key``, whole: a key may hold a ","); the consumer records a 5.x
message's keys (a set) sorted, so that is the smallest, what :func:`tracer.dispatch.cost.message_key`
reads on the producer. Messages without a key, or with one a cost table refuses (over 256
characters, unprintable), are left out and counted. The
span file and Jaeger both give the handler time per message; the Prometheus histograms do not
(no per-key label), so they cannot teach a per-key table.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..dispatch.costtable import MAX_ENTRIES, CostTable, CostTableError, check_cost, check_key, learn_costs
from .records import MessageRecord

__all__ = ["LearnedCosts", "costs_from_records"]


@dataclass(frozen=True)
class LearnedCosts:
    table: CostTable
    messages: int  # deliveries learned from
    left_out: int  # handled deliveries without a usable key

    def line(self, path: str) -> str:
        skipped = f"; {self.left_out} without a usable message key left out" if self.left_out else ""
        return (f"costs: {len(self.table)} keys from {self.messages} handled messages written to {path} "
                f"(unknown keys default to the median, {self.table.default:.3f} s){skipped}")


def costs_from_records(records: Iterable[MessageRecord], *, group: str | None = None,
                       job: str | None = None) -> LearnedCosts:
    """The median handler seconds per first message key of the handled ``records`` (only those of
    ``group`` and ``job`` when given).

    Raises:
        CostTableError: more than :data:`~tracer.dispatch.costtable.MAX_ENTRIES` keys.
    """
    samples: list[tuple[str, float]] = []
    left_out = 0
    keys: set[str] = set()
    for r in records:
        if (group is not None and r.group != group) or (job is not None and r.job_id != job) or not r.handled:
            continue
        key = r.key
        seconds = r.handler_s
        try:
            check_key(key, "message key")
            check_cost(seconds, "handler time")
        except CostTableError:
            left_out += 1
            continue
        keys.add(key)
        if len(keys) > MAX_ENTRIES:
            raise CostTableError(f"more than {MAX_ENTRIES} message keys; a cost table holds at most that many")
        samples.append((key, seconds))
    return LearnedCosts(learn_costs(samples), len(samples), left_out)
