__all__ = ["_instruments", "_instruments_legacy"]

# What `RocketMQInstrumentor` can patch; read by the instrumentor's dependency check and kept equal to
# pyproject's `instruments-any` extra, which the opentelemetry-instrument loader checks. Tested against
# rocketmq-python-client 5.1.2 (the store time is read from a private field of its Message) and
# rocketmq-client-python 2.0.0 with librocketmq.so from rocketmq-client-cpp 2.1.0.
_instruments = ("rocketmq-python-client >= 5.1.2, < 5.2",)
# The legacy client, when it is installed instead (both use the import name `rocketmq`).
_instruments_legacy = ("rocketmq-client-python >= 2.0.0, < 2.1",)
