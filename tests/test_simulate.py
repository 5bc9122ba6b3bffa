"""The zero-overhead simulators on hand-computed schedules."""

from __future__ import annotations

import pytest

from tracer.dispatch.simulate import (
    lower_bound,
    simulate_buffered,
    simulate_cost_aware,
    simulate_greedy,
    simulate_random,
    simulate_round_robin,
)
from tracer.tools.workload import make_job


def test_lower_bound() -> None:
    assert lower_bound([3, 1, 1, 1], 2) == 3  # total/workers = 3, longest = 3
    assert lower_bound([1, 1, 1, 1, 4], 2) == 4  # total/workers = 4
    assert lower_bound([10, 1], 4) == 10  # the longest dominates
    assert lower_bound([], 3) == 0
    with pytest.raises(ValueError):
        lower_bound([1], 0)


def test_greedy_hand_computed() -> None:
    # w0: 3 (0-3); w1: 1 (0-1), 1 (1-2), 1 (2-3)
    assert simulate_greedy([3, 1, 1, 1], 2) == 3
    # the long one arrives last: w0 1,1 then 4 from t=2 -> 6 (LB is 4)
    assert simulate_greedy([1, 1, 1, 1, 4], 2) == 6
    assert simulate_greedy([], 2) == 0


def test_round_robin_k10_with_one_long_message_is_worse_than_greedy() -> None:
    d = [10, 1, 1, 1, 1, 1, 1, 1, 1, 1]
    # round-robin: worker 0 gets messages 0,2,4,6,8 = 10+1+1+1+1 = 14; worker 1 gets 5 x 1 = 5
    assert simulate_round_robin(d, 2, 10) == 14
    # greedy: worker 0 runs the 10, worker 1 runs the nine 1s -> 10 = LB
    assert simulate_greedy(d, 2) == 10 == lower_bound(d, 2)


def test_round_robin_submitter_blocks_on_a_full_target() -> None:
    # K=0: message 2 targets worker 0, busy until 5; the submitter waits there, so message 3
    # (for the idle worker 1) also starts only at 5: w0 0-5, w1 0-1, w0 5-6, w1 5-6, w0 6-7.
    assert simulate_round_robin([5, 1, 1, 1, 1], 2, 0) == 7
    assert simulate_greedy([5, 1, 1, 1, 1], 2) == 5
    # a buffer absorbs it: K=1 lets message 3 enter worker 1 while worker 0 is busy
    assert simulate_round_robin([5, 1, 1, 1, 1], 2, 1) == 7  # w0: 5, then 1 (5-6), then 1 (6-7)


def test_buffered_explicit_targets_and_validation() -> None:
    assert simulate_buffered([2, 2, 2], 2, 5, [0, 0, 0]) == 6  # all on one worker
    assert simulate_buffered([2, 2, 2], 2, 5, [0, 1, 1]) == 4
    with pytest.raises(ValueError):
        simulate_buffered([1, 1], 2, 1, [0])
    with pytest.raises(ValueError):
        simulate_buffered([1], 2, -1, [0])


def test_random_matches_buffered_with_the_same_draws() -> None:
    import random

    d = [float(x.cases) for x in make_job(60, seed=3)]
    rng = random.Random(5)
    targets = [rng.randrange(4) for _ in d]
    assert simulate_random(d, 4, 3, seed=5) == simulate_buffered(d, 4, 3, targets)


def test_cost_aware_hand_computed() -> None:
    d = [1, 1, 4, 2, 2, 4]
    # the first two start at once; at t=1 both workers take a 4 (the costliest waiting), at t=5 the 2s
    assert simulate_cost_aware(d, 2, window=10) == 7 == lower_bound(d, 2)
    # greedy starts the last 4 only at t=5
    assert simulate_greedy(d, 2) == 9
    # a window of 1 leaves little choice: the same as greedy here
    assert simulate_cost_aware(d, 2, window=1) == 9
    with pytest.raises(ValueError):
        simulate_cost_aware(d, 2, window=0)


def test_cost_aware_uses_the_cost_hint_not_the_duration() -> None:
    d = [1, 1, 6, 1, 1, 1, 1, 1, 1]
    assert simulate_cost_aware(d, 2, window=10) == 7 == lower_bound(d, 2)  # the 6 starts at t=1
    wrong = [1, 1, 0, 1, 1, 1, 1, 1, 1]  # a misleading hint: the 6 starts last, at t=4
    assert simulate_cost_aware(d, 2, window=10, costs=wrong) == 10


def test_on_the_bench_job_the_policies_rank_as_expected() -> None:
    d = [float(x.cases) for x in make_job(500, seed=0)]
    lb, greedy = lower_bound(d, 8), simulate_greedy(d, 8)
    assert lb <= greedy
    assert simulate_cost_aware(d, 8, window=len(d)) <= 1.02 * lb
    assert simulate_round_robin(d, 8, 10) > 1.2 * greedy
