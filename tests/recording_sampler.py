"""A sampler that is not one of the SDK's stock ones (so rmqtrace calls it rather than evaluating
it inline) and is also a span processor: it records what the sampler is asked and what
``on_start`` is shown, for tests of spans written once at their end."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.trace.sampling import Decision, SamplingResult


class Recording:
    def __init__(self, decision: Decision) -> None:
        self.decision = decision
        self.asked: list[tuple[str, Any, dict[str, Any], list[Any]]] = []  # (name, kind, attributes, links)
        self.started: list[Any] = []

    def should_sample(self, parent_context: Any, trace_id: int, name: str, kind: Any = None,
                      attributes: Any = None, links: Any = None, trace_state: Any = None) -> SamplingResult:
        self.asked.append((name, kind, dict(attributes or {}), list(links or ())))
        return SamplingResult(self.decision, attributes)

    def get_description(self) -> str:
        return "recording"

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        self.started.append(span)

    def on_end(self, span: Any) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
