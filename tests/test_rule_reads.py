"""Every rule reads each scraped series once, in one query.

Prometheus evaluates each rule as a query of its own; a query sees whole scrapes as of its start
(TSDB isolation, 2.17+), but two queries of one evaluation may not see the same scrapes: one
landing between them is in the second and not the first. A rule that combines a recorded series
with a raw series that record also reads (or two records reading one raw series) can so join two
different moments of one instance — the fleet head-of-line rule once counted an instance as
starved (through rmqtrace:consumer_starved_workers:sum, before its scrape) and as a holder (its
raw unstarted messages, after), reading 4 idle workers where the fleet had 2. Discovered over
every shipped rule file.
"""

from __future__ import annotations

import re

import pytest

from services import RULES, load_rules

RULE_FILES = sorted(RULES.parent.glob("rmqtrace-*.yml"))
# our metric names: rmqtrace's own, its recorded ones (rmqtrace:...), and the broker exporter's
_NAME = re.compile(r"\b(?:rmqtrace[_:]|rocketmq_)[A-Za-z0-9_:]*")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
# (rule, raw series): read twice on purpose, with the reason
_ALLOWED: dict[tuple[str | None, str], str] = {}


def _reads(expr: str) -> set[str]:
    return set(_NAME.findall(_STRING.sub('""', expr)))


def _rules() -> list[dict[str, object]]:
    return [r for path in RULE_FILES for r in load_rules(path)]


def _recorded() -> dict[str, str]:
    return {str(r["record"]): str(r["expr"]) for r in _rules() if "record" in r}


def _raw(name: str, recorded: dict[str, str], seen: frozenset[str] = frozenset()) -> set[str]:
    """The scraped series a name stands for: itself, or what its record reads, transitively."""
    if name not in recorded:
        return {name}
    if name in seen:
        raise AssertionError(f"recording rules read each other in a cycle through {name}")
    return set().union(*(_raw(n, recorded, seen | {name}) for n in _reads(recorded[name])))


def test_the_rule_files_are_found() -> None:
    assert {p.name for p in RULE_FILES} >= {"rmqtrace-alerts.yml", "rmqtrace-fleet.yml", "rmqtrace-broker.yml",
                                            "rmqtrace-probe.yml"}


@pytest.mark.parametrize("rule", _rules(), ids=lambda r: str(r.get("record") or r.get("alert")))
def test_a_rule_reads_each_scraped_series_at_one_moment(rule: dict[str, object]) -> None:
    recorded = _recorded()
    sources = sorted(_reads(str(rule["expr"])))
    for i, a in enumerate(sources):
        for b in sources[i + 1:]:
            both = {m for m in _raw(a, recorded) & _raw(b, recorded) if (rule.get("alert"), m) not in _ALLOWED}
            assert not both, (f"{rule.get('record') or rule.get('alert')} reads {sorted(both)} twice, through {a} "
                              f"and {b}: two queries, possibly two different scrapes of one instance")
