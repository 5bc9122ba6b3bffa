"""RocketMQInstrumentor in someone else's process: the shared registry, its /metrics server, and
the dependency check ``opentelemetry-instrument`` runs before loading it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import sysconfig
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

from tracer.clients.instrumentor import RocketMQInstrumentor
from tracer.telemetry.metrics import TracerMetrics

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return int(resp.status)


def test_readme_flow_under_the_instrumentor_keeps_the_global_registry_scrapable():
    inst = RocketMQInstrumentor()
    inst.instrument(tracer_provider=TracerProvider())
    try:
        # what the README's own code does in a process opentelemetry-instrument already instrumented
        assert TracerMetrics.shared() is inst.metrics
        with pytest.raises(ValueError, match="shared"):
            TracerMetrics()
        text = generate_latest(REGISTRY).decode()  # every scrape failed with "Clashing name" before
        assert text.count("# TYPE rmqtrace_stage_duration_seconds histogram") == 1
    finally:
        inst.uninstrument()


def test_uninstrument_stops_the_metrics_server_so_instrument_can_run_again(monkeypatch):
    port = free_port()
    monkeypatch.setenv("RMQTRACE_METRICS_PORT", str(port))
    inst = RocketMQInstrumentor()
    registry = CollectorRegistry()
    for _ in range(2):
        inst.instrument(tracer_provider=TracerProvider(), registry=registry)  # EADDRINUSE the second time before
        try:
            assert scrape(port) == 200
        finally:
            inst.uninstrument()
        with pytest.raises(urllib.error.URLError):
            scrape(port)


# -- the loader's dependency check (opentelemetry-instrument's sitecustomize calls initialize()) --
_LOADER = textwrap.dedent("""
    import json, sys
    sys.path[:0] = sys.argv[1:]
    from opentelemetry.instrumentation.auto_instrumentation import initialize
    initialize()
    import rocketmq.v5.producer.producer as producer
    print(json.dumps({"patched": hasattr(producer.Producer.send, "__wrapped__")}))
""")


def _site_without_client(farm: Path, fake_version: str | None) -> Path:
    """A copy of site-packages made of links, without the client's metadata (or with a fake version)."""
    site = Path(sysconfig.get_paths()["purelib"])
    farm.mkdir()
    for entry in site.iterdir():
        if not entry.name.startswith("rocketmq_python_client-"):
            (farm / entry.name).symlink_to(entry)
    if fake_version is not None:
        meta = farm / f"rocketmq_python_client-{fake_version}.dist-info"
        meta.mkdir()
        (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: rocketmq-python-client\nVersion: {fake_version}\n")
    return farm


@pytest.mark.parametrize("client", ["installed", "missing", "5.0.0", "5.2.0"])
def test_opentelemetry_instrument_skips_the_instrumentor_without_a_matching_client(tmp_path, client):
    if client == "installed":
        farm = _site_without_client(tmp_path / "site", None)
        real = next(Path(sysconfig.get_paths()["purelib"]).glob("rocketmq_python_client-*.dist-info"))
        (farm / real.name).symlink_to(real)
    else:
        farm = _site_without_client(tmp_path / "site", None if client == "missing" else client)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RMQTRACE_", "PYTHON"))}
    env.update(OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none")
    # -S: no site-packages of its own, only the linked copy (and the repo for the editable install)
    proc = subprocess.run([sys.executable, "-S", "-c", _LOADER, str(farm), str(REPO)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    patched = json.loads(proc.stdout.strip().splitlines()[-1])["patched"]
    assert patched == (client == "installed"), proc.stderr[-2000:]
