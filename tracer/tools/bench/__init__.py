"""Benchmarks behind BENCHMARKS.md (``rmqtrace bench ...``)."""
