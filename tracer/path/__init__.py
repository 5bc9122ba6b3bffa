"""What is stamped and what travels: stages and gaps, stamps, clocks, message properties, names.

Nothing here knows OpenTelemetry or Prometheus; ``telemetry`` turns these facts into spans and
histograms, and ``report`` reads them back.
"""

__all__: list[str] = []
