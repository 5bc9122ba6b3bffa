"""The legacy client (rocketmq-client-python 2.0.0 + librocketmq.so) against the real broker's
remoting port (name server 9876, broker 10911), traced by rmqtrace.

The 2.x client installs the same top-level package ``rocketmq`` as the official 5.x client, so it
lives in its own venv (``services/rocketmq/legacy_venv.sh`` → ``.cache/legacy-venv``) and these
tests drive ``tests/legacy_programs/roundtrip.py`` there as a subprocess, which prints JSON.
Both modes run at once (each on its own topic and group) to keep the wall time down.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
from conftest import unavailable
from gap_shape import expected_children
from rmq_real import REPO, ensure_broker, fresh_topic, unique

pytestmark = pytest.mark.integration

PROGRAM = REPO / "tests" / "legacy_programs" / "roundtrip.py"
LEGACY_VENV_SH = REPO / "services" / "rocketmq" / "legacy_venv.sh"
N = 8
FAIL_SEQ = 3


def _legacy_python() -> str:
    try:
        proc = subprocess.run(["bash", str(LEGACY_VENV_SH)], capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        unavailable(f"legacy venv could not be built: {exc}")
    if proc.returncode != 0:
        unavailable(f"legacy venv could not be built (rc={proc.returncode}): {proc.stderr.strip()[-800:]}")
    python = proc.stdout.strip().splitlines()[-1]
    assert Path(python).exists(), python
    return python


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    ensure_broker()
    python = _legacy_python()
    procs = {}
    for mode in ("wrappers", "instrumentor"):
        env = dict(os.environ, RMQ_TOPIC=fresh_topic(f"legacy-{mode}"), RMQ_GROUP=unique(f"legacy-{mode}"),
                   N=str(N), FAIL_SEQ=str(FAIL_SEQ if mode == "wrappers" else -1), DEADLINE="60",
                   ROCKETMQ_CLIENT_LOG_DIR=str(tmp_path_factory.mktemp(f"cpplog-{mode}")),
                   PYTHONPATH="")
        procs[mode] = subprocess.Popen([python, str(PROGRAM), mode], cwd=REPO, env=env, text=True,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = {}
    for mode, proc in procs.items():
        try:
            stdout, stderr = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        assert proc.returncode == 0, f"{mode}: rc={proc.returncode}\n{stderr[-3000:]}"
        out[mode] = json.loads(stdout.strip().splitlines()[-1])
    return out


def _traces(result: dict) -> dict[str, list[dict]]:
    by_trace: dict[str, list[dict]] = defaultdict(list)
    for s in result["spans"]:
        by_trace[s["trace_id"]].append(s)
    return by_trace


def _check_linked_traces(result: dict, topic: str) -> dict[str, list[dict]]:
    """One trace per sent message: send → process(es) → handler + three gap spans each."""
    by_trace = _traces(result)
    sent_ids = {s["msg_id"] for s in result["sent"]}
    assert len(by_trace) == N
    for spans in by_trace.values():
        (send,) = [s for s in spans if s["name"] == f"send {topic}"]
        assert send["kind"] == "PRODUCER" and send["attributes"]["messaging.message.id"] in sent_ids
        assert send["attributes"]["messaging.rocketmq.message.tag"] == "legacy"
        processes = [s for s in spans if s["name"] == f"process {topic}"]
        assert processes
        for p in processes:
            assert p["kind"] == "CONSUMER" and p["parent_id"] == send["span_id"]
            assert p["attributes"]["messaging.message.id"] == send["attributes"]["messaging.message.id"]
            children = sorted(s["name"] for s in spans if s["parent_id"] == p["span_id"])
            assert children == expected_children(p["attributes"])  # an empty gap (client_buffer here) has no span
            stamps = [k for k in p["attributes"] if k.startswith("rmqtrace.stamp.")]
            assert len(stamps) == 6, stamps  # produce, broker_store, client_pull, dispatch_enqueue, handler x2
    return by_trace


def test_legacy_wrappers_trace_every_message_from_producer_to_handler(runs):
    r = runs["wrappers"]
    assert r["consumer_ready"] and r["done"], r
    assert all(s["status"] == "OK" for s in r["sent"])
    # every message handled (at-least-once: a rebalance may hand one out twice)
    assert {h["seq"] for h in r["handled"] if h["reconsume_times"] == 0} == set(range(N)), r["handled"]
    _check_linked_traces(r, r["topic"])
    # the broker's store time is read from the received message (ms, not the born time)
    process = [s for s in r["spans"] if s["name"].startswith("process")]
    # (placed within its millisecond: tracer.path.stamps.store_stamp)
    stores = {h["store_timestamp"] for h in r["handled"]}
    assert {p["attributes"]["rmqtrace.stamp.broker_store_ns"] // 1_000_000 for p in process} <= stores
    # histograms: one observation per delivery (readiness probes included) for every consumer gap
    counts = r["stage_counts"]
    assert counts["handler"] == counts["broker_wait"] == counts["dispatch_wait"] == r["deliveries"] >= N + 1


def test_legacy_reconsume_later_comes_back_as_delivery_attempt_two(runs):
    r = runs["wrappers"]
    attempts = [h for h in r["handled"] if h["seq"] == FAIL_SEQ]
    assert [h["reconsume_times"] for h in attempts] == [0, 1]
    assert attempts[0]["id"] == attempts[1]["id"]
    process = sorted((s for s in r["spans"] if s["name"].startswith("process")
                      and s["attributes"]["messaging.message.id"] == attempts[0]["id"]),
                     key=lambda s: s["start"])
    assert [p["attributes"]["rmqtrace.delivery_attempt"] for p in process] == [1, 2]
    assert [p["attributes"]["rmqtrace.outcome"] for p in process] == ["failure", "success"]
    assert process[0]["status"] == "ERROR"
    assert process[0]["parent_id"] == process[1]["parent_id"]  # both under the one send span


def test_legacy_instrumentor_traces_plain_code_and_unpatches_cleanly(runs):
    r = runs["instrumentor"]
    assert r["patched"] and r["consumer_ready"] and r["done"], r
    by_trace = _check_linked_traces(r, r["topic"])
    for spans in by_trace.values():
        p = next(s for s in spans if s["name"].startswith("process"))
        assert p["attributes"]["messaging.consumer.group.name"] == r["group"]
    assert r["restored"] is True
    assert r["spans_after_uninstrument"] == 0


def test_a_legacy_send_with_no_name_server_says_so_in_one_line(tmp_path):
    """The real 2.x client says "No route info of this topic: jobs,error:-1,in file <…cpp> line:434"
    with no name server; both traced seams say which it is and what to do (issue 33)."""
    python = _legacy_python()
    env = dict(os.environ, ROCKETMQ_CLIENT_LOG_DIR=str(tmp_path), PYTHONPATH="")
    proc = subprocess.run([python, str(REPO / "tests" / "legacy_programs" / "no_route.py")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(line) for line in proc.stdout.strip().splitlines()]
    assert [r["seam"] for r in results] == ["TracedLegacyProducer", "instrumentor"]
    for r in results:
        assert (r["type"], r["problem"]) == ("TopicRouteError", "RouteProblem.BROKER_DOWN"), r
        assert r["message"].startswith("no RocketMQ name server answers at 127.0.0.1:1: start one (`make stack`"), r
        assert r["client_error"].startswith("No route info of this topic: jobs"), r
