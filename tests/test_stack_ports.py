"""`make stack` with a port taken (issue 33): each service script checks its ports before any slow
step (Jaeger's cold build takes ~12 min, RocketMQ's jars minutes) and says what to do next."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO

SERVICES = REPO / "services"


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@pytest.fixture
def taken() -> Iterator[socket.socket]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s
    s.close()


def _start(script: Path, env: dict[str, str], timeout: float = 60, verb: str = "start") -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen(["bash", str(script), verb], env={**os.environ, **env}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # a build or download started: what this test forbids
        out, err = proc.communicate()
        pytest.fail(f"{script.name} start did not refuse the taken port within {timeout} s:\n{err[-2000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _jaeger_env(tmp_path: Path, otlp_http: int) -> dict[str, str]:
    query, query_grpc, otlp_grpc, metrics = _free_ports(4)
    return {"JAEGER_STATE_DIR": str(tmp_path / "state"), "JAEGER_BIN": str(tmp_path / "bin" / "jaeger"),
           "JAEGER_QUERY_PORT": str(query), "JAEGER_QUERY_GRPC_PORT": str(query_grpc),
           "JAEGER_OTLP_GRPC_PORT": str(otlp_grpc), "JAEGER_OTLP_HTTP_PORT": str(otlp_http),
           "JAEGER_PROM_EXPORTER_PORT": str(metrics)}


def test_jaeger_refuses_a_taken_port_before_it_builds(taken: socket.socket, tmp_path: Path) -> None:
    port = taken.getsockname()[1]
    done = _start(SERVICES / "jaeger" / "jaeger.sh", _jaeger_env(tmp_path, port))
    assert done.returncode == 1, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert f"127.0.0.1:{port} (JAEGER_OTLP_HTTP_PORT) is already in use" in line
    assert "stop it" in line and "JAEGER_OTLP_HTTP_PORT=<free port>" in line and "OTEL_EXPORTER_OTLP_ENDPOINT" in line
    assert "building" not in done.stderr and not (tmp_path / "bin" / "jaeger").exists()  # fails before: it built first


def test_rocketmq_refuses_a_taken_port_before_it_resolves_jars(tmp_path: Path) -> None:
    # rmq.sh's ports are fixed; a fresh run dir owns none of them, so a broker already running on
    # them (the shared one) is "another process" here — or, with none running, the socket below.
    holder = socket.socket()
    try:
        try:
            holder.bind(("127.0.0.1", 9876))
            holder.listen()
        except OSError:
            pass  # taken already
        done = _start(SERVICES / "rocketmq" / "rmq.sh", {"RMQ_RUN_DIR": str(tmp_path / "run"),
                                                          "RMQ_LIB_DIR": str(tmp_path / "lib")})
    finally:
        holder.close()
    assert done.returncode == 1, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert "port 9876 is in use by a process not started from" in line
    assert "stop it" in line and "RMQ_ENDPOINT=" in line
    assert not (tmp_path / "lib").exists() or not any((tmp_path / "lib").iterdir())  # fails before: resolved first


def test_prometheus_says_what_to_do_with_a_taken_port(taken: socket.socket, tmp_path: Path) -> None:
    port = taken.getsockname()[1]
    done = _start(SERVICES / "prometheus" / "prom.sh", {"PROM_PORT": str(port), "PROM_STATE_DIR": str(tmp_path)})
    if "prometheus not found" in done.stderr or "not installed" in done.stderr:
        pytest.skip("no prometheus binary")
    assert done.returncode == 1, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert f"127.0.0.1:{port} is already in use" in line and "stop it" in line and "PROM_PORT=<free port>" in line


def test_make_stack_checks_every_port_before_it_starts_anything(taken: socket.socket, tmp_path: Path) -> None:
    port = taken.getsockname()[1]
    env = {**_jaeger_env(tmp_path, port), "PROM_STATE_DIR": str(tmp_path / "prom"), "PROM_PORT": str(_free_ports(1)[0])}
    done = _start(SERVICES / "stack.sh", env, verb="up")
    assert done.returncode == 1, done.stderr
    assert f"127.0.0.1:{port} (JAEGER_OTLP_HTTP_PORT) is already in use" in done.stderr.strip().splitlines()[-1]
    assert "starting RocketMQ" not in done.stderr  # fails before: RocketMQ started, then Jaeger built, then this
