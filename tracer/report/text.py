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


# A share of consumer_wait reads as a problem; of an almost empty total it is noise (the demo's
# aggressive policy: "48 %" of a few milliseconds, 0.4-48 % from run to run). Below both bounds a
# verdict gives the seconds alone and calls them negligible.
MATERIAL_S = 0.1  # avoidable wait in all


MATERIAL_PER_MESSAGE_S = 0.005  # avoidable wait per message


def sentence_seconds(seconds: float) -> str:
    """Seconds for a sentence: 38.2 s, 412 ms, 85 µs."""
    if seconds >= 1 or seconds == 0:
        return f"{seconds:.1f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.0f} ms"
    return f"{seconds * 1e6:.0f} µs"


# -- the one rule every report view words avoidable wait by -------------------------------------
def is_material(avoidable_s: float, messages: int) -> bool:
    """Whether avoidable wait is large enough for its share of consumer_wait to mean something:
    :data:`MATERIAL_S` in all and :data:`MATERIAL_PER_MESSAGE_S` per message. A share of an almost
    empty total (48 % of a few ms) reads as a problem that is not there."""
    return avoidable_s >= MATERIAL_S and messages > 0 and avoidable_s / messages >= MATERIAL_PER_MESSAGE_S


def avoidable_verdict(avoidable_s: float, wait_s: float, messages: int, where: str = "") -> str:
    """The one verdict every view prints (group report, fleet view, demos; terminal, HTML):
    absolute avoidable seconds first (in all, per message), the share of consumer_wait only when
    :func:`is_material`; "nobody waited" only when nothing was avoidable, so two views of one run
    never say opposite things. ``where`` qualifies it (" in the fleet")."""
    if avoidable_s <= 0:
        return "nobody waited while a worker was free" + where
    per = avoidable_s / messages if messages else 0.0
    text = f"{sentence_seconds(avoidable_s)} of consumer_wait was avoidable{where} ({sentence_seconds(per)} per message"
    if is_material(avoidable_s, messages):
        share = avoidable_s / wait_s if wait_s > 0 else 0.0
        return text + f", {share:.0%} of the {sentence_seconds(wait_s)} waited)"
    return text + ": negligible)"


def avoidable_cell(avoidable_s: float, wait_s: float, messages: int) -> str:
    """:func:`avoidable_verdict` for a table cell: the seconds, the share only when material."""
    if not is_material(avoidable_s, messages):
        return sentence_seconds(avoidable_s)
    return f"{sentence_seconds(avoidable_s)} ({avoidable_s / wait_s if wait_s > 0 else 0.0:.0%})"


def fleet_verdict(avoidable: dict[str, float], messages: int) -> str:
    """:func:`avoidable_verdict` for a job across instances (:func:`fleet_avoidable`'s dict), then
    where a free worker was, in seconds."""
    fleet_s = avoidable.get("avoidable_fleet_s", 0.0)
    text = avoidable_verdict(fleet_s, avoidable.get("consumer_wait_s", 0.0), messages, " in the fleet")
    if fleet_s > 0:
        text += (f" — {sentence_seconds(avoidable.get('avoidable_elsewhere_s', 0.0))} while another instance had a free worker, "
                 f"{sentence_seconds(avoidable.get('avoidable_inside_s', 0.0))} while its own instance had one")
    return text


__all__ = ["MATERIAL_PER_MESSAGE_S", "MATERIAL_S", "NEAR_LOWER_BOUND", "avoidable_cell", "avoidable_verdict", "fleet_verdict",
           "format_seconds", "is_material", "sent_order_words", "sentence_seconds", "where_time_went_line"]
