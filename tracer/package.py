# What `RocketMQInstrumentor` can patch; read by opentelemetry-instrument's dependency check.
_instruments = ("rocketmq-python-client >= 5.0.5, < 6",)
