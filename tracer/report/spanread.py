"""A span file read for the report: the ``process`` spans parsed, the others only when needed.

A message is one ``process`` span; its exact stamps are its own attributes. The other five spans
a message writes (``send`` and the four stage spans) matter only for a message whose stamps are
missing or untrustworthy (:func:`tracer.report.model.exact_stamps`), yet parsing them was most of
``json.loads``' time (two thirds of the bytes; BENCHMARKS.md, "Reading traces"). So one pass:

* a line containing ``"process`` (a process span's name ``process {topic}`` or its
  ``messaging.operation.type`` value; JSON writes both unescaped) is parsed as before;
* a line as :class:`~tracer.telemetry.spanfile.JsonLinesSpanExporter` writes it — starting
  ``{"trace_id":"`` and ending ``}`` — without that text is counted as a span unparsed;
* any other non-blank line is parsed as before (and counted as not a span when it is not one).

Only if some process span needs its related spans is the file read a second time, parsing just
the skipped lines of those traces. The records and counts are those of
``messages_from_spans(read_spans(path))`` except for a line that starts and ends like a span yet is
broken inside and holds no ``"process``: counted as a span, never used unless its trace is needed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, cast

from ..path import names
from ..telemetry.spanfile import SpanRecord
from .records import MessageRecord, by_start, messages_from_spans, record_from_fields
from .sources import SourceError, read_span_path

__all__ = ["SpanFile", "process_spans", "read_span_file"]

_SPAN_LINE = '{"trace_id":"'  # how the exporter starts every line (span_to_dict's first key)
_PROCESS_MARK = '"process'
_OPERATION_TYPE, _PROCESS = names.OPERATION_TYPE, names.PROCESS
_PROCESS_NAME = names.process_span_name("")


@dataclass(frozen=True, slots=True)
class SpanFile:
    """What one span file gave: the message records (by start) and how its lines were counted."""

    records: list[MessageRecord]
    spans: int  # lines that are spans (skipped ones as the exporter writes them included)
    lines: int  # non-blank lines
    skipped: int  # span lines not parsed (no process span among them, none of them needed)

    @property
    def unparsed(self) -> int:
        return self.lines - self.spans


# the C scanner json.loads ends in, without its two regex passes (the stubs do not declare it)
_scan: Callable[[str, int], tuple[Any, int]] = cast(Any, json.JSONDecoder()).scan_once


def _loads(line: str) -> Any:
    """``json.loads(line)``, 30 % cheaper for a line that starts with its value (every exporter line).

    Raises:
        ValueError: what ``json.loads`` raises for it (not JSON, or extra data after the value).
    """
    try:
        value, end = _scan(line, 0)
    except StopIteration:
        return json.loads(line)  # leading whitespace or no JSON value here: loads parses it or says why
    if line[end:].strip(" \t\n\r"):  # JSON's whitespace only, as loads allows
        raise ValueError(f"extra data after the JSON value at column {end}")
    return value


def _record(d: dict[str, Any], attrs: dict[str, Any]) -> SpanRecord:
    """:func:`tracer.telemetry.spanfile.read_spans`' record of one parsed line."""
    return SpanRecord(
        trace_id=str(d["trace_id"]), span_id=str(d["span_id"]), parent_span_id=d.get("parent_span_id"),
        name=str(d["name"]), kind=str(d.get("kind", "INTERNAL")), start_ns=int(d["start_ns"]),
        end_ns=int(d["end_ns"]), status=str(d.get("status", "UNSET")), service=d.get("service"),
        attributes=dict(attrs))


def _span(line: str) -> SpanRecord | None:
    try:
        d = _loads(line)
        return _record(d, d.get("attributes") or {})
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _skippable(line: str) -> bool:
    return line.startswith(_SPAN_LINE) and _PROCESS_MARK not in line and (line.endswith("}\n") or line.rstrip().endswith("}"))


def read_span_file(path: str | Path) -> SpanFile:
    """The message records of a JSON-lines span file (see the module doc).

    Raises:
        SourceError: no such file, a folder, or it cannot be read.
    """
    return read_span_path(path, _read)


def _read(p: Path) -> SpanFile:
    lines = spans = skipped = 0
    seen: set[tuple[str, str]] = set()
    records: list[MessageRecord] = []
    pending: list[SpanRecord] = []  # process spans without exact stamps: they need their trace's other spans
    others: list[SpanRecord] = []  # other spans that had to be parsed anyway (not as the exporter writes them)
    loads = _loads
    with p.open(encoding="utf-8", errors="replace") as fh:
        for line in fh:
            # _skippable, inlined: this runs for every line of the file
            if line.startswith(_SPAN_LINE) and _PROCESS_MARK not in line and (
                    line.endswith("}\n") or line.rstrip().endswith("}")):
                lines += 1
                spans += 1
                skipped += 1
                continue
            if not line.strip():
                continue
            lines += 1
            try:
                d = loads(line)
                trace_id, span_id, name = str(d["trace_id"]), str(d["span_id"]), str(d["name"])
                kind, end_ns, attrs = str(d.get("kind", "INTERNAL")), int(d["end_ns"]), d.get("attributes") or {}
                int(d["start_ns"])  # a span has one (read_spans' rule), though only its end is used here
                if not isinstance(attrs, dict):
                    attrs = dict(attrs)
            except (ValueError, KeyError, TypeError, AttributeError):
                continue  # not a span (read_spans' rule)
            spans += 1
            if not (attrs.get(_OPERATION_TYPE) == _PROCESS or (name.startswith(_PROCESS_NAME) and kind.upper() == "CONSUMER")):
                others.append(_record(d, attrs))  # is_process_span, on the fields
                continue
            key = (trace_id, span_id)
            if key in seen:
                continue  # a span written twice: the first one counts (messages_from_spans' rule)
            seen.add(key)
            service = d.get("service")
            record = record_from_fields(trace_id, span_id, name, end_ns, attrs, "" if service is None else str(service))
            if record is None:
                pending.append(_record(d, attrs))
            else:
                records.append(record)
    if pending:
        wanted = {s.trace_id for s in pending}
        second = _skipped_spans(p, wanted)
        records += messages_from_spans(pending + [s for s in others if s.trace_id in wanted] + second)
        skipped -= len(second)
    records.sort(key=by_start)
    return SpanFile(records, spans, lines, skipped)


def _skipped_spans(p: Path, traces: set[str]) -> list[SpanRecord]:
    """The second pass: the skipped lines of ``traces``, parsed."""
    out: list[SpanRecord] = []
    start = len(_SPAN_LINE)
    with p.open(encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if not _skippable(line):
                continue
            end = line.find('"', start)
            if line[start:end] in traces:
                span = _span(line)
                if span is not None:
                    out.append(span)
    return out


def process_spans(path: str | Path) -> Iterator[tuple[str, str, str | None, dict[str, Any]]]:
    """``(trace id, span id, service, attributes)`` of every process span of a span file, each id
    pair once, with the read's skip rule (other spans are never parsed). The fleet view's source.

    Raises:
        SourceError: no such file, a folder, or it cannot be read.
    """
    p = Path(path)
    if not p.exists() or p.is_dir():
        read_span_file(p)  # raises the read's own error
    seen: set[tuple[str, str]] = set()
    try:
        with p.open(encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if _PROCESS_MARK not in line or not line.strip():
                    continue  # not a process span, whatever else it is
                try:
                    d = _loads(line)
                    key = (str(d["trace_id"]), str(d["span_id"]))
                    name, kind, attrs = str(d["name"]), str(d.get("kind", "INTERNAL")), d.get("attributes") or {}
                    if not isinstance(attrs, dict):
                        attrs = dict(attrs)
                except (ValueError, KeyError, TypeError, AttributeError):
                    continue
                if key in seen or not (attrs.get(_OPERATION_TYPE) == _PROCESS or (
                        name.startswith(_PROCESS_NAME) and kind.upper() == "CONSUMER")):
                    continue
                seen.add(key)
                service = d.get("service")
                yield key[0], key[1], str(service) if service is not None else None, attrs
    except OSError as exc:
        raise SourceError(f"cannot read {p}: {exc}") from exc
