"""The broker's side of the wait, read from a Prometheus that scrapes a RocketMQ broker's exporter.

RocketMQ 5.x brokers export, per (topic, consumer group), the messages ready for the group (not yet
handed to any consumer), in flight and lagging (past the group's consume offset), and the age of the
oldest ready message (queueing latency) and of the oldest lagging one (lag latency)
(``rocketmq_consumer_*``; broker.conf ``metricsExporterType=PROM``). Measured on 5.5 with 5.x (pop)
consumers: a message a consumer received but has not acked counts as consumed until its invisible
time ends, so these say what waits for the group *before* any consumer took it — the part rmqtrace's
own series, which see a message only once a consumer pulled it, cannot. :func:`fetch_backlog` asks Prometheus for them (the raw
broker series, so it works without rmqtrace's recording rules); ``rmqtrace probe --prometheus``
and ``rmqtrace report --prometheus`` print them.
"""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from .model import Report

__all__ = ["Backlog", "PrometheusError", "fetch_backlog", "print_for_report", "prometheus_url"]

# Series as the RocketMQ 5.5 broker exports them (OpenTelemetry's Prometheus exporter appends the
# unit). An empty retry queue reports a lag latency near -9.2e18 ms: `>= 0` drops it.
_QUERIES = {
    "ready_messages": "sum by (topic, consumer_group) (rocketmq_consumer_ready_messages{{{sel}}})",
    "inflight_messages": "sum by (topic, consumer_group) (rocketmq_consumer_inflight_messages{{{sel}}})",
    "lag_messages": "sum by (topic, consumer_group) (rocketmq_consumer_lag_messages{{{sel}}})",
    "oldest_ready_s": "max by (topic, consumer_group) (rocketmq_consumer_queueing_latency_milliseconds{{{sel}}} >= 0) / 1000",
    "lag_latency_s": "max by (topic, consumer_group) (rocketmq_consumer_lag_latency_milliseconds{{{sel}}} >= 0) / 1000",
}
_CONSUMERS = 'sum by (consumer_group) (rocketmq_consumer_connections{{consumer_group=~"{groups}"}})'


class PrometheusError(Exception):
    """Prometheus could not be asked, or refused the query."""


@dataclass(frozen=True)
class Backlog:
    """The broker's figures for one (topic, consumer group); None where the broker reports none."""

    topic: str
    consumer_group: str
    ready_messages: float | None = None
    inflight_messages: float | None = None
    lag_messages: float | None = None
    oldest_ready_s: float | None = None
    lag_latency_s: float | None = None
    consumers: float = 0.0

    def describe(self) -> str:
        """One line: what waits for the group on the broker, and how old the oldest of it is."""
        ready = int(self.ready_messages or 0)
        parts = [f"{ready} ready" + (f" (oldest {self.oldest_ready_s:.1f} s)" if ready and self.oldest_ready_s else "")]
        if self.inflight_messages:
            parts.append(f"{int(self.inflight_messages)} in flight")
        if self.lag_latency_s:
            parts.append(f"lag latency {self.lag_latency_s:.1f} s")
        n = int(self.consumers)
        parts.append(f"{n} consumer{'' if n == 1 else 's'} connected")
        line = f"{self.consumer_group} on {self.topic}: " + ", ".join(parts)
        if ready and n == 0:
            line += " — nothing pulls them"
        elif ready:
            line += " — a new message (or probe) queues behind them"
        return line

    def as_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "consumer_group": self.consumer_group, "ready_messages": self.ready_messages,
                "inflight_messages": self.inflight_messages, "lag_messages": self.lag_messages,
                "oldest_ready_s": self.oldest_ready_s, "lag_latency_s": self.lag_latency_s,
                "consumers": self.consumers}


def prometheus_url(text: str) -> str:
    """argparse type: an http(s) URL of a Prometheus server."""
    parsed = urllib.parse.urlparse(text)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise argparse.ArgumentTypeError(f"expected the http(s) URL of a Prometheus server, got {text!r}")
    return text.rstrip("/")


def _label_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _query(url: str, expr: str, timeout: float) -> list[dict[str, Any]]:
    full = f"{url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    try:
        with urllib.request.urlopen(full, timeout=timeout) as resp:
            body = json.load(resp)
    except urllib.error.HTTPError as exc:
        try:
            body = json.loads(exc.read() or b"{}")
        except ValueError:
            raise PrometheusError(f"{url}: HTTP {exc.code}") from exc
    except (OSError, ValueError) as exc:
        raise PrometheusError(f"{url}: {getattr(exc, 'reason', None) or exc}") from exc
    if body.get("status") != "success":
        raise PrometheusError(f"{url}: {body.get('errorType')}: {body.get('error')}")
    return list(body["data"]["result"])


def fetch_backlog(url: str, topics: list[str], groups: list[str] | None = None, *,
                  timeout: float = 10.0) -> list[Backlog]:
    """The broker's backlog for every group of ``topics`` (only ``groups`` when given), sorted.

    Empty when Prometheus has no broker series for them: its broker exporter is not scraped, or
    the broker knows no group of the topic (a group is reported once a consumer connected or it
    committed an offset).

    Raises:
        ValueError: no topic given.
        PrometheusError: Prometheus unreachable or the query refused.
    """
    if not topics:
        raise ValueError("fetch_backlog needs at least one topic")
    sel = 'is_system="false", topic=~"' + "|".join(_label_value(_regex_quote(t)) for t in topics) + '"'
    if groups:
        sel += ', consumer_group=~"' + "|".join(_label_value(_regex_quote(g)) for g in groups) + '"'
    values: dict[tuple[str, str], dict[str, float]] = {}
    for field, template in _QUERIES.items():
        for sample in _query(url, template.format(sel=sel), timeout):
            m = sample["metric"]
            values.setdefault((m.get("topic", ""), m.get("consumer_group", "")), {})[field] = float(sample["value"][1])
    if not values:
        return []
    names = "|".join(_label_value(_regex_quote(g)) for g in sorted({g for _, g in values}))
    consumers = {s["metric"].get("consumer_group", ""): float(s["value"][1])
                 for s in _query(url, _CONSUMERS.format(groups=names), timeout)}
    return [Backlog(topic, group, consumers=consumers.get(group, 0.0), **fields)
            for (topic, group), fields in sorted(values.items())]


def _regex_quote(text: str) -> str:
    # topic and group names are [A-Za-z0-9%|_-]; '|' is the only regex metacharacter among them
    return "".join("\\" + c if c in r".^$*+?()[]{}|\\" else c for c in text)


def print_for_report(report: Report, url: str, out: TextIO) -> bool:
    """``rmqtrace report --prometheus``: the broker's backlog for the report's topics and groups.
    False (after one error line on stderr) when Prometheus cannot be asked."""
    import sys

    topics = sorted({r.topic for g in report.groups for r in g.records if r.topic})
    groups = sorted(g.group for g in report.groups)
    try:
        backlog = fetch_backlog(url, topics, groups) if topics else []
    except PrometheusError as exc:
        print(f"rmqtrace report: --prometheus {exc}", file=sys.stderr)
        return False
    if not backlog:
        print(f"broker side: no rocketmq_consumer_* series for these topics and groups in {url} "
              "(is the broker's exporter scraped?)", file=out)
        return True
    print(f"broker side, now ({url}):", file=out)
    for b in backlog:
        print(f"  {b.describe()}", file=out)
    return True
