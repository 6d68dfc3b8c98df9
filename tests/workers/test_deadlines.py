from __future__ import annotations

import pytest

from workers.data_path.deadlines import DeadlinePolicy, LatencyTracker, deadline_from_samples

POLICY = DeadlinePolicy(floor_s=1.0, ceiling_s=20.0, multiplier=4.0, quantile=0.9, window=10, initial_s=5.0)


def test_initial_deadline_before_any_sample():
    assert LatencyTracker(POLICY).deadline_s() == 5.0


def test_deadline_is_multiple_of_quantile_clamped():
    assert deadline_from_samples([0.01] * 10, POLICY) == 1.0  # floor
    assert deadline_from_samples([100.0], POLICY) == 20.0  # ceiling
    samples = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 2.0]
    assert deadline_from_samples(samples, POLICY) == pytest.approx(8.0)  # 4 × the 90th percentile sample


def test_window_forgets_old_samples():
    tracker = LatencyTracker(POLICY)
    for _ in range(10):
        tracker.observe(4.0)
    assert tracker.deadline_s() == 16.0
    for _ in range(10):
        tracker.observe(0.5)
    assert tracker.deadline_s() == 2.0


def test_bad_policy():
    with pytest.raises(ValueError):
        DeadlinePolicy(floor_s=5, initial_s=1, ceiling_s=10)
