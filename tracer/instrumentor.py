"""Documented import path; the instrumentor lives in :mod:`tracer.clients.instrumentor`."""

from .clients.instrumentor import RocketMQInstrumentor

__all__ = ["RocketMQInstrumentor"]
