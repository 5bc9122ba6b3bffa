"""The fleet view's reader: :func:`read_jaeger_fleet` collects one service's process spans from
Jaeger into a :class:`~tracer.report.fleet.FleetCollector`, window by window.

Each window is at most a page of traces; a full page means the window may hold more, so it is split
in halves and read again. Traces seen twice (a trace whose spans straddle two windows, or one of a
full page read again in a half) are skipped by id. Two read paths: Jaeger's ``api_v3`` gRPC
``FindTraces`` (OTLP protobuf streamed one trace at a time, so a page can be the whole window:
default when ``grpcio`` is installed and the service answers), else the HTTP JSON
``/api/traces`` the UI uses (``page_limit`` traces per page, each page parsed whole).
BENCHMARKS.md ("bench report") has the numbers behind the choice.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Iterator

from .fleet import V3_DEPTH, FleetCollector

__all__ = ["read_jaeger_fleet"]


def read_jaeger_fleet(base_url: str, service: str, *, start_s: float | None = None, end_s: float | None = None,
                      lookback_s: float = 3600.0, page_limit: int = 500, timeout: float = 30.0,
                      get: Callable[[str, float], dict[str, Any]] | None = None, api: str = "auto",
                      grpc_target: str | None = None, depth: int = V3_DEPTH) -> FleetCollector:
    """Every trace of ``service`` in [start, end] (default: the last ``lookback_s`` seconds) into a
    :class:`FleetCollector`; ``collector.api`` says which read path was used.

    ``api``: ``"v3"`` (api_v3 gRPC at ``grpc_target``, default: for a URL on port 16686 its host on
    port 16685; pages of ``depth`` traces), ``"http"`` (``/api/traces``, pages of ``page_limit``
    traces, fetched by ``get`` when given) or ``"auto"``: v3 unless ``get`` is given, no gRPC
    address is known, grpcio is missing or nothing answers there; then http.

    Raises:
        ValueError: ``page_limit`` or ``depth`` < 2, an empty window or an unknown ``api``.
        SourceError: the v3 service failed after it had answered (``api="v3"``: also when it is
            unreachable).
    """
    from .sources import paused_gc

    with paused_gc():  # the collector's records: no cycles (see paused_gc)
        return _read_fleet(base_url, service, start_s=start_s, end_s=end_s, lookback_s=lookback_s,
                           page_limit=page_limit, timeout=timeout, get=get, api=api, grpc_target=grpc_target,
                           depth=depth)


def _read_fleet(base_url: str, service: str, *, start_s: float | None, end_s: float | None, lookback_s: float,
                page_limit: int, timeout: float, get: Callable[[str, float], dict[str, Any]] | None, api: str,
                grpc_target: str | None, depth: int) -> FleetCollector:
    from .sources import SourceError, v3_target

    if page_limit < 2 or depth < 2:
        raise ValueError(f"page_limit and depth must be at least 2, got {page_limit} and {depth}")
    if api not in ("auto", "v3", "http"):
        raise ValueError(f"api must be auto, v3 or http, got {api!r}")
    end = time.time() if end_s is None else end_s
    start = end - lookback_s if start_s is None else start_s
    if end <= start:
        raise ValueError(f"empty time window: start {start} >= end {end}")
    collector = FleetCollector()
    base = base_url.rstrip("/")
    target = v3_target(base, grpc_target)
    if api == "v3" and target is None:
        raise ValueError(f"api v3: give grpc_target (host:port); {base_url} is not on Jaeger's default port 16686")
    if target is not None and (api == "v3" or (api == "auto" and get is None)):
        try:
            _read_v3(collector, target, service, int(start * 1e9), int(end * 1e9), depth, timeout)
            collector.api = f"api_v3 gRPC {target}"
            return collector
        except ImportError:
            if api == "v3":
                raise
        except SourceError:
            if api == "v3" or collector.pages or collector.traces:
                raise
        collector = FleetCollector()  # auto: nothing answered at the v3 port; read the HTTP API
    for payload in _pages(base, service, int(start * 1e6), int(end * 1e6), page_limit, timeout, get or _get_json):
        collector.add_jaeger_page(payload)
    collector.api = f"HTTP JSON {base}/api/traces"
    return collector


def _read_v3(collector: FleetCollector, target: str, service: str, start_ns: int, end_ns: int, depth: int,
             timeout: float) -> None:
    """Windows of at most ``depth`` traces, streamed into ``collector``. A full page is kept (its
    traces are complete) and its window read again in two parts, where those traces are skipped:
    split at the median start of the page's traces, not at the window's middle, since a job's
    traces crowd a few seconds of an hour's window (a midpoint split re-read all 10⁵ six times)."""
    from .sources import SearchDepthTooLarge, find_traces_v3

    seen: set[bytes] = set()
    windows = [(start_ns, end_ns)]
    while windows:
        a, b = windows.pop()
        page: dict[bytes, int] = {}
        try:
            for traces_data in find_traces_v3(target, service, a, b, depth=depth, timeout=timeout, raw=True):
                collector.add_otlp_trace(traces_data, seen, page)
        except SearchDepthTooLarge:
            if page or depth <= 2:
                raise
            depth //= 2  # the store caps the depth (memory: max_traces): smaller pages, same window
            windows.append((a, b))
            continue
        collector.pages += 1
        seen.update(page)
        if len(page) >= depth and b - a > 1:
            starts = sorted(page.values())
            mid = starts[len(starts) // 2]
            if not a < mid < b:
                mid = (a + b) // 2
            windows += [(mid, b), (a, mid)]


def _pages(base: str, service: str, start_us: int, end_us: int, limit: int, timeout: float,
           fetch: Callable[[str, float], dict[str, Any]]) -> Iterator[dict[str, Any]]:
    windows = [(start_us, end_us)]
    while windows:
        a, b = windows.pop()
        query = urllib.parse.urlencode({"service": service, "limit": limit, "start": a, "end": b})
        payload = fetch(f"{base}/api/traces?{query}", timeout)
        if len(payload.get("data") or ()) >= limit and b - a > 1:
            mid = (a + b) // 2  # the window may hold more than one page: read both halves instead
            windows += [(mid, b), (a, mid)]
            continue
        yield payload


def _get_json(url: str, timeout: float) -> dict[str, Any]:
    req = urllib.request.Request(url, headers={"Accept": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - the user's own Jaeger
        data = json.load(resp)
    if not isinstance(data, dict):
        raise ValueError(f"unexpected answer from {url}: {str(data)[:200]}")
    return data
