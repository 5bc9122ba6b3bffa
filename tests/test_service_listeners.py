"""Every socket the project's services listen on is on loopback (issue 24).

The services are the ones ``make test`` starts: RocketMQ (name server + proxy/broker JVM,
services/rocketmq/rmq.sh), Jaeger (jaeger.sh), Prometheus (prom.sh) and Alertmanager (am.sh). Each
is started (or found running) through its script; every TCP listener and unconnected UDP socket of
its processes (and their children) is read from /proc and must be bound to 127.0.0.0/8 or ::1.
The RocketMQ JVM must show the ports it is known to open, so a listener that moved to another
process or an empty /proc read cannot pass unnoticed. A version bump or a new service that opens
a wildcard port fails here.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO, unavailable
from rmq_real import ensure_broker
from waiting import wait_until

from services import start_prometheus

pytestmark = pytest.mark.integration

# Every port the RocketMQ JVMs are configured to open (services/rocketmq/conf, rmq.sh).
ROCKETMQ_PORTS = {"namesrv": {9876}, "proxy": {8081, 8080, 10911, 10909, 10912, 5557}}


@dataclass(frozen=True)
class Listener:
    proto: str
    address: str
    port: int
    pid: int

    def loopback(self) -> bool:
        ip = ipaddress.ip_address(self.address)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return ip.is_loopback


def _decode(hex_addr: str) -> tuple[str, int]:
    addr, port = hex_addr.split(":")
    raw = bytes.fromhex(addr)
    # /proc/net/tcp{,6}: the address in 32-bit words of host byte order (little-endian here)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, words), int(port, 16)


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        if p not in out:
            out.add(p)
            todo.extend(children.get(p, []))
    return out


def listeners(pid: int) -> list[Listener]:
    """TCP sockets in LISTEN and unbound-peer UDP sockets of ``pid`` and its descendants."""
    owner = {inode: p for p in _descendants(pid) for inode in _socket_inodes(p)}
    found = []
    for proto, listening_state in (("tcp", "0A"), ("tcp6", "0A"), ("udp", "07"), ("udp6", "07")):
        try:
            lines = Path(f"/proc/{pid}/net/{proto}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            local, remote, state, inode = cols[1], cols[2], cols[3], cols[9]
            if state != listening_state or inode not in owner:
                continue
            if proto.startswith("udp") and _decode(remote)[1] != 0:
                continue  # a connected UDP socket (a DNS query) receives from its peer only
            address, port = _decode(local)
            found.append(Listener(proto, address, port, owner[inode]))
    return found


def _pid(pid_file: Path) -> int:
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        unavailable(f"no pid in {pid_file}")
        raise
    if not Path(f"/proc/{pid}").exists():
        unavailable(f"{pid_file}: pid {pid} is not running")
    return pid


def _exposed(pid: int) -> list[Listener]:
    return [s for s in listeners(pid) if not s.loopback()]


# -- the checker itself sees a wildcard listener --------------------------------------------------
def test_the_checker_sees_a_wildcard_listener_and_a_loopback_one() -> None:
    code = ("import socket, sys\n"
            "a = socket.socket(); a.bind(('0.0.0.0', 0)); a.listen()\n"
            "b = socket.socket(); b.bind(('127.0.0.1', 0)); b.listen()\n"
            "u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(('0.0.0.0', 0))\n"
            # the child holds its sockets until the test kills it (or its stdin closes)
            "print(a.getsockname()[1], b.getsockname()[1], u.getsockname()[1], flush=True); sys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        wild, lo, udp = (int(x) for x in proc.stdout.readline().split())
        got = {(s.proto, s.port, s.loopback()) for s in listeners(proc.pid)}
        assert got == {("tcp", wild, False), ("tcp", lo, True), ("udp", udp, False)}
    finally:
        proc.kill()
        proc.wait(10)


# -- the services ---------------------------------------------------------------------------------
def _rmq_run_dir() -> Path:
    return Path(os.environ.get("RMQ_RUN_DIR") or (REPO / ".cache").resolve() / "rocketmq" / "run")


def test_rocketmq_listens_on_loopback_only() -> None:
    ensure_broker()
    run = _rmq_run_dir()
    for name, ports in ROCKETMQ_PORTS.items():
        pid = _pid(run / f"{name}.pid")
        socks = listeners(pid)
        assert ports <= {s.port for s in socks}, f"{name}: expected ports {sorted(ports)}, found {socks}"
        assert not _exposed(pid), f"{name} (pid {pid}) listens beyond loopback: {_exposed(pid)}"


def test_jaeger_listens_on_loopback_only() -> None:
    script = REPO / "services" / "jaeger" / "jaeger.sh"
    proc = subprocess.run(["bash", str(script), "start"], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        unavailable(f"jaeger.sh start failed: {proc.stderr.strip()[-500:]}")
    pid = _pid(Path(os.environ.get("JAEGER_STATE_DIR") or REPO / ".cache" / "jaeger") / "jaeger.pid")
    wait_until(lambda: {16686, 4317, 4318} <= {s.port for s in listeners(pid)}, timeout=30, interval=0.5,
               what="jaeger listening on its query and OTLP ports")
    assert not _exposed(pid), _exposed(pid)


def test_prometheus_listens_on_loopback_only(tmp_path: Path) -> None:
    prom = start_prometheus(["127.0.0.1:5557"], [], state_dir=tmp_path / "prom")
    try:
        pid = _pid(tmp_path / "prom" / "prometheus.pid")
        assert prom.port in {s.port for s in listeners(pid)}
        assert not _exposed(pid), _exposed(pid)
    finally:
        prom.stop()


def test_alertmanager_listens_on_loopback_only() -> None:
    from test_alertmanager_e2e import AM_SH, _start_alertmanager

    state = Path(tempfile.mkdtemp(prefix="rmqtrace-am-sock-"))
    port, env = _start_alertmanager(state, "http://127.0.0.1:9/unused")
    try:
        pid = _pid(state / "alertmanager.pid")
        assert port in {s.port for s in listeners(pid)}
        assert not _exposed(pid), _exposed(pid)
    finally:
        subprocess.run(["bash", str(AM_SH), "stop"], env=env, capture_output=True, timeout=60)
