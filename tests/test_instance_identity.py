"""Instances are first-class: every span carries ``service.instance.id`` (settable, host:pid by
default, the standard OTEL_RESOURCE_ATTRIBUTES honoured)."""

from __future__ import annotations

import os
import socket

from tracer.config import Settings, configure_tracing, default_instance_id


def _instance(settings: Settings) -> object:
    provider = configure_tracing(settings, set_global=False)
    assert provider is not None
    return provider.resource.attributes.get("service.instance.id")


def test_default_is_host_and_pid() -> None:
    assert default_instance_id() == f"{socket.gethostname()}:{os.getpid()}"
    assert _instance(Settings.from_env({})) == default_instance_id()


def test_settable_by_rmqtrace_variable_and_by_resource_attributes() -> None:
    assert Settings.from_env({"RMQTRACE_INSTANCE_ID": "consumer-7"}).instance_id == "consumer-7"
    env = {"OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod, service.instance.id=pod-3"}
    assert Settings.from_env(env).instance_id == "pod-3"
    assert _instance(Settings(instance_id="consumer-7")) == "consumer-7"
