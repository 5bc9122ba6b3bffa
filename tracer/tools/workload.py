"""Synthetic jobs shaped like the incident: test-case groups with a long-tailed number of cases.

Most groups hold a few cases, about one in ten a few dozen, and about one in a hundred a few
hundred — the long tail that, dealt round-robin into a worker's buffer, held up everything queued
behind it. Deterministic for a seed; groups come in random order (a long group may arrive last).
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class JobItem:
    """One message of a job: a test-case group and how many cases it runs (its cost hint)."""

    group_id: str
    cases: int


def make_job(n_groups: int = 500, seed: int = 0) -> list[JobItem]:
    """``n_groups`` test-case groups: ~89 % 1–12 cases, ~10 % 10–60, ~1 % (at least one) 150–600.

    The head has a median of about 3 cases (1 + an exponential of mean 2.5, capped at 12).
    """
    if n_groups < 0:
        raise ValueError("n_groups must be >= 0")
    rng = random.Random(seed)
    n_tail = max(1, round(n_groups / 100)) if n_groups else 0
    n_mid = round(n_groups / 10) if n_groups > n_tail else 0
    n_mid = min(n_mid, n_groups - n_tail)
    cases = [rng.randint(150, 600) for _ in range(n_tail)]
    cases += [rng.randint(10, 60) for _ in range(n_mid)]
    cases += [min(12, 1 + int(rng.expovariate(1 / 2.5))) for _ in range(n_groups - n_tail - n_mid)]
    rng.shuffle(cases)
    return [JobItem(f"tg-{seed}-{i:04d}", c) for i, c in enumerate(cases)]


def job_cases(item: JobItem) -> float:
    """The cost hint of a job message (its number of cases), for ``cost=`` and ``longest_first``."""
    return float(item.cases)


__all__ = ["JobItem", "make_job", "job_cases"]
