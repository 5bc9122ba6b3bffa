"""The synthetic job: deterministic, long-tailed, shared by the bench and the demo."""

from __future__ import annotations

import statistics

import pytest

from tracer.dispatch import longest_first
from tracer.tools.workload import JobItem, job_cases, make_job


def test_deterministic_per_seed() -> None:
    assert make_job(200, seed=4) == make_job(200, seed=4)
    assert make_job(200, seed=4) != make_job(200, seed=5)


def test_shape_is_long_tailed() -> None:
    for seed in range(5):
        job = make_job(500, seed=seed)
        cases = [j.cases for j in job]
        assert len(job) == 500
        assert len({j.group_id for j in job}) == 500
        assert all(isinstance(j, JobItem) and j.cases >= 1 for j in job)
        assert statistics.median(cases) <= 5  # most groups: a few cases
        tail = [c for c in cases if c >= 150]
        assert 1 <= len(tail) <= 10  # a few: hundreds
        assert max(cases) <= 600
        # the tail is a large share of the work: what makes dealing order matter
        assert sum(tail) > 0.15 * sum(cases)


def test_small_and_empty_jobs() -> None:
    assert make_job(0) == []
    one = make_job(1, seed=2)
    assert len(one) == 1 and one[0].cases >= 150  # the single group is the tail
    assert len(make_job(7)) == 7
    with pytest.raises(ValueError):
        make_job(-1)


def test_longest_first_is_stable_descending() -> None:
    job = make_job(50, seed=1)
    ordered = longest_first(job, job_cases)
    assert [j.cases for j in ordered] == sorted((j.cases for j in job), reverse=True)
    a, b, c = JobItem("a", 2), JobItem("b", 5), JobItem("c", 2)
    assert longest_first([a, b, c], job_cases) == [b, a, c]
