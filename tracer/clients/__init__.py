"""Seams into RocketMQ clients: the traced producer, the consume loop, the official 5.x gRPC client,
the legacy 2.x API and the ``opentelemetry-instrument`` instrumentor."""

__all__: list[str] = []
