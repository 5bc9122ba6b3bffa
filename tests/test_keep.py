"""The keep policy on its own: thresholds, failures, background share, slowest-X %, job state."""

from __future__ import annotations

import math
import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracer.path.stages import Outcome, Stage
from tracer.telemetry.keep import PENDING, KeepPolicy, Slowest, parse_threshold

T0 = 1_700_000_000_000_000_000
MS = 1_000_000


def stamps(end_ns: int, *, dispatch_ms: float = 0.0, buffer_ms: float = 0.0, handler_ms: float = 1.0,
           produce_ns: int | None = None) -> list[int]:
    """Stamps of one message that ended at ``end_ns`` after the given gaps."""
    start = end_ns - int(handler_ms * MS)
    enq = start - int(dispatch_ms * MS)
    pull = enq - int(buffer_ms * MS)
    store = pull - MS
    produce = produce_ns if produce_ns is not None else store - MS
    t = [0] * len(Stage)
    t[Stage.PRODUCE], t[Stage.BROKER_STORE], t[Stage.CLIENT_PULL] = produce, store, pull
    t[Stage.DISPATCH_ENQUEUE], t[Stage.HANDLER_START], t[Stage.HANDLER_END] = enq, start, end_ns
    return t


def test_every_message_over_an_absolute_threshold_and_every_failure_is_kept() -> None:
    rng = random.Random(1)
    policy = KeepPolicy({"dispatch_wait": 0.050, "end_to_end": 2.0}, background=0.0, rng=rng)
    now = T0
    for i in range(3000):
        now += MS
        wait = rng.expovariate(1 / 20.0)  # ms; ~8 % over 50 ms
        outcome = Outcome.FAILURE if i % 97 == 0 else Outcome.TIMEOUT if i % 101 == 0 else Outcome.SUCCESS
        reason = policy.decide(stamps(now, dispatch_ms=wait), outcome)
        if wait > 50.0 + 1e-6:
            assert reason is not None, (i, wait)
        elif outcome is not Outcome.SUCCESS:
            assert reason == "failure"
        else:
            assert reason is None, (i, wait, reason)
    s = policy.statistics()
    assert s.messages == s.kept + s.dropped == 3000
    assert s.slow >= s.by_reason["slow"] > 0  # a slow failure counts as slow and is kept as a failure


def test_head_sampled_messages_are_kept_and_still_counted() -> None:
    policy = KeepPolicy({"dispatch_wait": 10.0})
    assert policy.decide(stamps(T0), Outcome.SUCCESS, head=True) == "head"
    assert policy.decide(stamps(T0 + MS), Outcome.SUCCESS) is None
    assert policy.statistics().messages == 2


def test_kept_share_of_fast_messages_matches_the_background_probability() -> None:
    p, n = 0.05, 40_000
    policy = KeepPolicy({"dispatch_wait": 1.0}, background=p, rng=random.Random(12345))
    kept = sum(policy.decide(stamps(T0 + i * MS, dispatch_ms=1.0), Outcome.SUCCESS) == "background"
               for i in range(n))
    sigma = math.sqrt(n * p * (1 - p))
    assert abs(kept - n * p) < 4 * sigma, (kept, n * p, sigma)


def test_slowest_share_is_judged_against_the_last_interval() -> None:
    rng = random.Random(7)
    policy = KeepPolicy({"consumer_wait": Slowest(5.0)}, interval_s=10.0, rng=rng)
    now = T0
    # the first interval only builds the estimate: nothing is slow yet
    for _ in range(5000):
        now += MS
        assert policy.decide(stamps(now, dispatch_ms=rng.lognormvariate(1.0, 1.0)), Outcome.SUCCESS) is None
    now += 10_000 * MS
    policy.decide(stamps(now, dispatch_ms=1.0), Outcome.SUCCESS)  # rolls the interval
    threshold = policy.slow_threshold_s("consumer_wait")
    assert threshold is not None
    waits = [rng.lognormvariate(1.0, 1.0) for _ in range(5000)]
    kept = 0
    for w in waits:
        now += MS
        reason = policy.decide(stamps(now, dispatch_ms=w), Outcome.SUCCESS)
        if w / 1000 > threshold * 1.0001:
            assert reason == "slow"
        kept += reason == "slow"
    # the estimate's buckets are 9 % wide: the kept share sits just under the asked 5 %
    assert 0.025 < kept / len(waits) < 0.06, kept / len(waits)


def test_the_first_and_the_latest_finisher_of_a_job_are_kept() -> None:
    policy = KeepPolicy(job_idle_s=5.0)
    settled: dict[int, bool] = {}

    def settle(i: int):  # noqa: ANN202
        return lambda keep: settled.__setitem__(i, keep)

    now = T0
    assert policy.decide(stamps(now), Outcome.SUCCESS, "job-1", settle=settle(0)) == "job_start"
    for i in range(1, 6):
        now += MS
        assert policy.decide(stamps(now), Outcome.SUCCESS, "job-1", settle=settle(i)) == PENDING
        if i > 1:
            assert settled[i - 1] is False  # displaced by a later finisher
    # a message that finished before the latest one is not on the critical path
    assert policy.decide(stamps(now - 3 * MS), Outcome.SUCCESS, "job-1", settle=settle(99)) is None
    assert 5 not in settled
    # another job's message, after the first job went idle, settles its latest finisher as kept
    now += 6_000 * MS
    policy.decide(stamps(now), Outcome.SUCCESS, "job-2", settle=settle(100))
    assert settled[5] is True
    assert policy.statistics().by_reason["critical_path"] == 1
    policy.flush()  # job-2's only message was kept as its start; nothing left pending
    assert policy.statistics().pending == 0


def test_job_state_is_bounded_and_an_evicted_job_keeps_its_latest() -> None:
    policy = KeepPolicy(max_jobs=10, job_idle_s=3600.0)
    settled: list[bool] = []
    now = T0
    for j in range(100):
        for _ in range(2):
            now += MS
            policy.decide(stamps(now), Outcome.SUCCESS, f"job-{j}", settle=settled.append)
    assert policy.statistics().pending <= 10
    assert settled.count(True) == 90  # one per evicted job
    policy.flush()
    assert settled.count(True) == 100 and policy.statistics().pending == 0


def test_thresholds_from_the_environment() -> None:
    policy = KeepPolicy.from_env({"RMQTRACE_KEEP_DISPATCH_WAIT": "250ms", "RMQTRACE_KEEP_END_TO_END": "1%",
                                  "RMQTRACE_KEEP_BACKGROUND": "0.01"})
    assert policy is not None
    assert policy.thresholds == {"dispatch_wait": 0.25, "end_to_end": Slowest(1.0)}
    assert policy.background == 0.01
    assert KeepPolicy.from_env({"OTEL_TRACES_SAMPLER": "always_off"}) is None
    with pytest.raises(ValueError, match="RMQTRACE_KEEP_CLIENT_BUFFER"):
        KeepPolicy.from_env({"RMQTRACE_KEEP_CLIENT_BUFFER": "soon"})
    with pytest.raises(ValueError, match="RMQTRACE_KEEP_BACKGROUND"):
        KeepPolicy.from_env({"RMQTRACE_KEEP_BACKGROUND": "often"})


@pytest.mark.parametrize("text,value", [("0.5", 0.5), ("2s", 2.0), ("250ms", 0.25), ("1.5%", Slowest(1.5))])
def test_parse_threshold(text: str, value: object) -> None:
    assert parse_threshold(text) == value


@pytest.mark.parametrize("kwargs", [{"background": 1.5}, {"interval_s": 0}, {"max_jobs": 0},
                                    {"thresholds": {"handler": 1.0}}, {"thresholds": {"dispatch_wait": -1}}])
def test_arguments_that_cannot_work_fail_at_once(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        KeepPolicy(**kwargs)
    with pytest.raises(ValueError):
        Slowest(100.0)


# -- the job state, against its rule, on any order of finishes ------------------------------------------
_OPS = st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 3000), st.integers(0, 50)), max_size=80)


@settings(max_examples=400 if os.environ.get("RMQTRACE_LONG") == "1" else 60, deadline=None)
@given(ops=_OPS, max_jobs=st.integers(1, 4))
def test_each_jobs_latest_finisher_is_kept_once_and_every_message_is_decided_once(ops, max_jobs) -> None:
    """Finishes of a few jobs in any order (``back`` ms before the clock: out of order), with idle
    gaps and a small job bound: every message is decided exactly once (kept now, dropped now, or
    settled later), and after flush the message that finished last in each job is kept."""
    policy = KeepPolicy(job_idle_s=2.0, max_jobs=max_jobs)
    decided: dict[int, list[bool]] = {}
    ends: dict[str, list[tuple[int, int]]] = {}
    now, produce = T0, T0 - 10**12
    for i, (job, dt_ms, back_ms) in enumerate(ops):
        now += dt_ms * MS
        produce += 1  # produce stamps only grow: job_start marks a job's first message seen
        end = now - back_ms * MS
        decided[i] = []
        reason = policy.decide(stamps(end, produce_ns=produce), Outcome.SUCCESS, job,
                               settle=lambda keep, i=i: decided[i].append(keep))
        if reason is None:
            decided[i].append(False)
        elif reason != PENDING:
            decided[i].append(True)
        ends.setdefault(job, []).append((end, i))
    policy.flush()
    assert all(len(v) == 1 for v in decided.values()), decided
    assert policy.statistics().pending == 0
    for job, seen in ends.items():
        latest = max(e for e, _ in seen)
        last_of_latest = max(i for e, i in seen if e == latest)
        assert decided[last_of_latest] == [True], (job, seen, decided)


# -- the demo with --trace-sampling --------------------------------------------------------------------
def test_demo_keeps_every_slow_message_and_the_critical_path_and_the_report_agrees(tmp_path, capsys) -> None:
    import json

    from tracer.report.model import build_report
    from tracer.report.sources import read_jsonl
    from tracer.tools.cli import main

    assert main(["demo", "--groups", "120", "--workers", "4", "--case-ms", "2", "--policies",
                 "round_robin,aggressive", "--trace-sampling", "0.05", "--out", str(tmp_path), "--json"]) == 0
    runs = {r["policy"]: r for r in json.loads(capsys.readouterr().out.strip().splitlines()[-1])}
    for r in runs.values():
        assert r["messages"] == 120 and 0 < r["traces_kept"] < 120
        assert r["slow_kept"] == r["slow_messages"] and r["critical_path_kept"] is True
    assert runs["round_robin"]["slow_messages"] > 0  # the incident: messages waited > 1 s in the consumer
    # the report over the sampled recording: the same completion time (first produce -> last end)
    report = build_report(read_jsonl(tmp_path / "spans.jsonl"))
    for g in report.groups:
        (job,) = g.jobs
        assert abs(job.completion_s - runs[g.group.removeprefix("demo-")]["makespan_s"]) < 1e-3, g.group


def test_demo_trace_sampling_must_be_a_probability(capsys) -> None:
    import pytest

    from tracer.tools.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["demo", "--trace-sampling", "1.5"])
    assert exc.value.code == 2 and "probability" in capsys.readouterr().err


_ENV_ONLY = r'''
import json, sys
from opentelemetry import trace
from tracer import MessageInfo, MessageTracer, Outcome, Stage
from tracer.config import Settings, configure_tracing

configure_tracing(Settings.from_env())
tracer = MessageTracer(consumer_group="g")   # no keep=/hold=: the environment decides
for i, wait_ms in enumerate((1, 500, 2, 800)):
    t = tracer.start_message(MessageInfo(topic="t", message_id=f"m{i}"), pulled_ns=10**18)
    t.mark(Stage.DISPATCH_ENQUEUE, 10**18)
    t.mark(Stage.HANDLER_START, 10**18 + wait_ms * 10**6)
    with t.handler_scope(10**18 + wait_ms * 10**6):
        with trace.get_tracer("user").start_as_current_span(f"user-{i}"):
            pass
    t.mark(Stage.HANDLER_END, 10**18 + (wait_ms + 1) * 10**6)
    t.finish(Outcome.SUCCESS)
trace.get_tracer_provider().shutdown()
names = [json.loads(line)["name"] for line in open(sys.argv[1])]
print(json.dumps(sorted(n for n in names if n.startswith("user-"))))
'''


def test_the_environment_alone_turns_keeping_on(tmp_path) -> None:
    # RMQTRACE_KEEP_* through configure_tracing, with no code change: the two slow messages are kept
    # whole (the user's spans included), the two fast ones are dropped before export.
    import json
    import os
    import subprocess
    import sys

    spans = tmp_path / "spans.jsonl"
    env = dict(os.environ, RMQTRACE_SPANS_FILE=str(spans),
               OTEL_TRACES_SAMPLER="parentbased_always_off", RMQTRACE_KEEP_CONSUMER_WAIT="0.1")
    env.pop("OTEL_TRACES_EXPORTER", None)
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    out = subprocess.run([sys.executable, "-c", _ENV_ONLY, str(spans)], env=env, capture_output=True,
                         text=True, timeout=60, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["user-1", "user-3"], out.stderr


_INSTRUMENTED = r'''
import json, sys
from opentelemetry import trace
from tracer import MessageInfo, MessageTracer, Outcome, Stage

# no configure_tracing: opentelemetry-instrument set the SDK provider up before this ran
assert type(trace.get_tracer_provider()).__name__ == "TracerProvider", trace.get_tracer_provider()
tracer = MessageTracer(consumer_group="g")   # no keep=/hold=: the environment decides
for i, wait_ms in enumerate((1, 500, 2, 800)):
    t = tracer.start_message(MessageInfo(topic="t", message_id=f"m{i}"), pulled_ns=10**18)
    t.mark(Stage.DISPATCH_ENQUEUE, 10**18)
    with t.handler_scope(10**18 + wait_ms * 10**6):
        with trace.get_tracer("user").start_as_current_span(f"user-{i}"):
            pass
    t.mark(Stage.HANDLER_END, 10**18 + (wait_ms + 1) * 10**6)
    t.finish(Outcome.SUCCESS)
trace.get_tracer_provider().shutdown()
'''


def test_the_environment_turns_keeping_on_under_opentelemetry_instrument(tmp_path) -> None:
    """The provider exists before rmqtrace runs (the distro built it): RMQTRACE_KEEP_* still applies."""
    import os
    import re
    import shutil
    import subprocess
    import sys

    instrument = shutil.which("opentelemetry-instrument", path=os.path.dirname(sys.executable))
    if instrument is None:
        pytest.skip("opentelemetry-distro is not installed (pip install 'rmqtrace[instrument]')")
    script = tmp_path / "app.py"
    script.write_text(_INSTRUMENTED)
    env = dict(os.environ, OTEL_TRACES_EXPORTER="console", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none",
               OTEL_TRACES_SAMPLER="parentbased_always_off", RMQTRACE_KEEP_CONSUMER_WAIT="0.1",
               OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="rocketmq")
    out = subprocess.run([instrument, sys.executable, str(script)], env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    assert sorted(set(re.findall(r'"name": "(user-\d)"', out.stdout))) == ["user-1", "user-3"], out.stderr[-2000:]


def test_a_provider_the_policy_cannot_apply_to_says_so_once(caplog) -> None:
    import logging

    from opentelemetry import trace

    from tracer.telemetry.tracer import MessageTracer

    class VendorProvider(trace.TracerProvider):
        def get_tracer(self, *args: object, **kwargs: object) -> trace.Tracer:
            return trace.NoOpTracer()

    vendor = VendorProvider()
    os.environ["RMQTRACE_KEEP_CONSUMER_WAIT"] = "0.1"
    try:
        with caplog.at_level(logging.WARNING, logger="tracer.telemetry.adopt"):
            for _ in range(3):
                assert MessageTracer(consumer_group="g", tracer_provider=vendor).keep is None
    finally:
        del os.environ["RMQTRACE_KEEP_CONSUMER_WAIT"]
    warnings = [r for r in caplog.records if "RMQTRACE_KEEP_" in r.getMessage()]
    assert len(warnings) == 1 and "VendorProvider" in warnings[0].getMessage()
