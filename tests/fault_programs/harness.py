"""What the reliability tests share: the real broker (reachable, per-test topics and groups), a
producer of numbered messages, consumer processes (``consumer.py`` beside this file) and their
logs, and the figures each test leaves in ``rmqtrace-out/reliability/`` for RELIABILITY.md.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from conftest import unavailable
from waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
RMQ_SH = REPO / "services" / "rocketmq" / "rmq.sh"
ENDPOINT = "127.0.0.1:8081"
FIGURES = REPO / "rmqtrace-out" / "reliability"

_started_lock = threading.Lock()


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def ensure_broker() -> None:
    """The shared RocketMQ is up (started if it was not; never stopped here), else skip/fail."""
    try:
        import rocketmq  # noqa: F401
    except ImportError:
        unavailable("rocketmq-python-client is not installed (pip install -e '.[rocketmq]')")
    with _started_lock:
        if not (port_open(8081) and port_open(10911)):
            proc = subprocess.run(["bash", str(RMQ_SH), "start"], capture_output=True, text=True, timeout=900)
            if proc.returncode != 0 or not port_open(8081):
                unavailable(f"RocketMQ not reachable on {ENDPOINT} and `rmq.sh start` failed: "
                            f"{proc.stderr.strip()[-600:]}")


def admin() -> Any:
    path = str(REPO / "services" / "rocketmq")
    if path not in sys.path:
        sys.path.insert(0, path)
    import rmq_admin
    return rmq_admin


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def create(topic: str, groups: Iterable[str] = ()) -> None:
    a = admin()
    a.create_topic(topic)
    for g in groups:
        a.create_group(g)


def client_config(ak: str = "", sk: str = "") -> Any:
    from rocketmq import ClientConfiguration, Credentials
    return ClientConfiguration(ENDPOINT, Credentials(ak, sk))


def start_producer(topic: str, tracer: Any = None, config: Any = None) -> Any:
    """A started producer; traced (``TracedProducer``) when a tracer is given."""
    from rocketmq import Producer

    from tracer.clients.producer import TracedProducer

    p = Producer(config or client_config(), (topic,), tls_enable=False)
    p.startup()
    return TracedProducer(p, tracer) if tracer is not None else p


def message(topic: str, seq: int) -> Any:
    from rocketmq import Message
    m = Message()
    m.topic = topic
    m.body = str(seq).encode()
    return m


def send_numbered(producer: Any, topic: str, seqs: Iterable[int], threads: int = 4,
                  retry_for: float = 0.0, pace: float = 0.0, stop: threading.Event | None = None) -> dict[str, int]:
    """Send one message per seq (body = seq). A failed send is retried for ``retry_for`` seconds
    (a broker restarting); ``pace`` seconds between sends per thread; ``stop`` ends it early.
    Returns counts."""
    counts: Counter[str] = Counter()
    lock = threading.Lock()
    stop = stop or threading.Event()

    def one(seq: int) -> None:
        deadline = time.monotonic() + retry_for
        while not stop.is_set():
            try:
                producer.send(message(topic, seq))
                with lock:
                    counts["sent"] += 1
                break
            except Exception:  # noqa: BLE001 - counted; retried while the broker may come back
                with lock:
                    counts["send_errors"] += 1
                if time.monotonic() > deadline:
                    with lock:
                        counts["gave_up"] += 1
                    return
                stop.wait(0.5)
        if pace:
            stop.wait(pace)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, seqs))
    return dict(counts)


# -- consumer processes ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Line:
    kind: str
    seq: int
    attempt: int
    message_id: str
    pid: int


@dataclass
class ConsumerProcess:
    proc: subprocess.Popen[bytes]
    log: Path
    stats_path: Path
    stderr_path: Path

    def lines(self) -> list[Line]:
        return read_log(self.log)

    def count(self, kind: str) -> int:
        return sum(1 for ln in self.lines() if ln.kind == kind)

    def wait_ready(self, timeout: float = 60) -> None:
        wait_until(lambda: self.count("READY") > 0 or self.proc.poll() is not None, timeout=timeout,
                   interval=0.05, what="consumer process ready")
        assert self.proc.poll() is None, f"consumer exited early:\n{self.stderr()}"

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(f"consumer pid {self.proc.pid} did not exit within {timeout}s:\n{self.stderr()}") from None

    def stats(self) -> dict[str, Any]:
        return json.loads(self.stats_path.read_text())

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text()[-3000:]
        except OSError:
            return ""


class Consumers:
    """Starts ``consumer.py`` processes; kills any still running at teardown (by pid, ours only)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.started: list[ConsumerProcess] = []

    def start(self, topic: str, group: str, *args: str, env: dict[str, str] | None = None,
              log: Path | None = None) -> ConsumerProcess:
        n = len(self.started)
        log = log or self.tmp / "handled.log"
        stats = self.tmp / f"stats-{n}.json"
        err = self.tmp / f"consumer-{n}.stderr"
        home = self.tmp / "home"  # the 5.x client writes its log under ~/logs at import
        home.mkdir(exist_ok=True)
        full_env = dict(os.environ, HOME=str(home), PYTHONUNBUFFERED="1", **(env or {}))
        cmd = [sys.executable, str(HERE / "consumer.py"), "--topic", topic, "--group", group,
               "--log", str(log), "--stats", str(stats), *args]
        with open(err, "wb") as errf:
            proc = subprocess.Popen(cmd, stdout=errf, stderr=subprocess.STDOUT, env=full_env, cwd=str(REPO))
        cp = ConsumerProcess(proc, log, stats, err)
        self.started.append(cp)
        return cp

    def cleanup(self) -> None:
        for cp in self.started:
            if cp.proc.poll() is None:
                cp.proc.send_signal(signal.SIGKILL)
                cp.proc.wait(10)


def read_log(path: Path) -> list[Line]:
    out = []
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    for raw in text.splitlines():
        parts = raw.split()
        if len(parts) != 5:
            continue  # a line torn by SIGKILL cannot happen (one write), but be safe
        kind, seq, attempt, mid, pid = parts
        out.append(Line(kind, int(seq) if seq != "-" else -1, int(attempt) if attempt != "-" else 0, mid, int(pid)))
    return out


@dataclass
class Accounting:
    """Who handled what, from the log of every consumer process of one test."""

    lines: list[Line]
    by_kind: dict[str, list[Line]] = field(default_factory=lambda: defaultdict(list))

    def __post_init__(self) -> None:
        for ln in self.lines:
            self.by_kind[ln.kind].append(ln)

    def seqs(self, kind: str, pid: int | None = None) -> set[int]:
        return {ln.seq for ln in self.by_kind[kind] if pid is None or ln.pid == pid}

    def handled_counts(self) -> Counter[int]:
        """Completed handler runs per seq (``D`` lines)."""
        return Counter(ln.seq for ln in self.by_kind["D"])

    def duplicates(self) -> dict[int, int]:
        return {s: n for s, n in self.handled_counts().items() if n > 1}


def record_figures(name: str, figures: dict[str, Any]) -> None:
    """Keep a test's figures for RELIABILITY.md (``rmqtrace-out/reliability/<name>.json``)."""
    FIGURES.mkdir(parents=True, exist_ok=True)
    figures = {"test": name, "recorded_at": time.strftime("%Y-%m-%d %H:%M:%S"), **figures}
    (FIGURES / f"{name}.json").write_text(json.dumps(figures, indent=2, sort_keys=True, default=str) + "\n")
    print(f"\n[reliability] {name}: {json.dumps(figures, sort_keys=True, default=str)}")


def poll(cond: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> None:
    wait_until(cond, timeout=timeout, interval=interval, what=what)
