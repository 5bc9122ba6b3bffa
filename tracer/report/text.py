"""The sentences both the demo and the report print: durations, where a group's time went, caveats."""

from __future__ import annotations

from typing import Mapping

from ..path.stages import HEADLINE_GAP
from .jobs import MIXED_ORDER, WAITING_PARTS


def format_seconds(v: float | None) -> str:
    """A duration for people: µs, ms or s with sensible precision; ``—`` when unknown."""
    if v is None:
        return "—"
    if v == 0:
        return "0"
    if v < 0.001:
        return f"{v * 1e6:.0f} µs"
    if v < 1:
        return f"{v * 1e3:.1f} ms"
    return f"{v:.2f} s"


_ORDER_WORDS = {"longest_first": "longest first", "arrival": "in arrival order",
                MIXED_ORDER: "mixed orders", "": "not recorded"}


def sent_order_words(order: str) -> str:
    """How the report and the demo say a send order: "longest first", "in arrival order", …"""
    return _ORDER_WORDS.get(order, order)


# A job within 10% of its lower bound: the wait inside the consumer, however large its share, did not lengthen it.
NEAR_LOWER_BOUND = 1.10


def where_time_went_line(name: str, shares: Mapping[str, float], over_lb: float | None, busy: float | None) -> str:
    """Where a consumer group's (a demo policy's) time went, in one line led by the headline gap.

    ``shares`` maps gap names to their part of all path time (send … handler, i.e. end to end);
    ``over_lb`` is the job's completion over its lower bound, ``busy`` the workers' busy share.
    """
    wait = shares.get(HEADLINE_GAP.name, 0.0)
    parts = " + ".join(f"{p} {shares.get(p, 0.0):.0%}" for p in WAITING_PARTS)
    line = f"{name}: {HEADLINE_GAP.name} (waiting inside the consumer) was {wait:.0%} of end-to-end time ({parts})"
    if over_lb:
        line += f"; job took {over_lb:.2f}× the lower bound"
    if busy is not None:
        line += f", workers busy {busy:.0%} of the time"
    broker = shares.get("send", 0.0) + shares.get("broker_wait", 0.0)
    handler = shares.get("handler", 0.0)
    if wait >= max(broker, handler) and over_lb and over_lb < NEAR_LOWER_BOUND:
        return line + (f" — messages waited inside the consumer, yet the job finished within {over_lb - 1:.0%} of its "
                       "lower bound: here the wait did not make it longer")
    if wait >= max(broker, handler):
        return line + " — messages queued inside the consumer, where no other consumer could take them"
    if broker >= handler:
        return line + " — most of the wait was in the broker, where any free consumer can take a message"
    return line + " — most of the time was the handlers' own work"


__all__ = ["NEAR_LOWER_BOUND", "format_seconds", "sent_order_words", "where_time_went_line"]
