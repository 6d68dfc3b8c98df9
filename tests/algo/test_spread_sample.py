"""The replica spread estimated from a sample of replicas: unbiased, a 95% interval that covers
the whole stage's spread, exact when the sample is the whole stage."""

from __future__ import annotations

import math
import random
import statistics

import pytest
import torch

from noloco_rt.algo.diagnostics import pooled_spread, replica_spread
from noloco_rt.algo.spread_sample import (
    SpreadEstimate,
    estimate_spread,
    jackknife_variance,
    pooled_estimate,
    squared_distances_to_mean,
    student_t_quantile,
)

SHAPES = [(8, 8), (16,)]


def stage_population(count: int, seed: int = 0) -> list[list[torch.Tensor]]:
    """`count` replicas around one centre, each with its own distance from it (as replicas drift)."""
    generator = torch.Generator().manual_seed(seed)
    centre = [torch.randn(shape, generator=generator) for shape in SHAPES]
    scales = torch.rand(count, generator=generator) * 1.5 + 0.25
    return [[c + float(s) * torch.randn(c.shape, generator=generator) for c in centre] for s in scales]


def test_squared_distances_average_to_the_squared_spread():
    replicas = stage_population(5)
    distances = squared_distances_to_mean(replicas)
    assert len(distances) == 5 and min(distances) > 0
    assert statistics.fmean(distances) == pytest.approx(replica_spread(replicas) ** 2, rel=1e-9)


def test_the_whole_stage_is_exact_and_its_interval_collapses_to_the_point():
    replicas = stage_population(6)
    estimate = estimate_spread(replicas, population=6)
    assert estimate.spread == pytest.approx(replica_spread(replicas), rel=1e-9)
    assert estimate.low == estimate.high == estimate.spread and estimate.exact
    assert (estimate.sampled, estimate.population) == (6, 6)
    one = estimate_spread(replicas[:1], population=1)
    assert one.spread == one.low == one.high == 0.0


def test_the_interval_covers_the_whole_stage_spread_in_most_samples():
    population = stage_population(200)
    truth = replica_spread(population)
    trials = [estimate_spread(random.Random(seed).sample(population, 8), population=200) for seed in range(50)]
    covered = sum(e.low <= truth <= e.high for e in trials)
    assert covered >= 0.8 * len(trials), f"{covered} of {len(trials)} intervals hold the spread {truth}"
    # Informative, not merely wide: from 8 replicas whose distances to the centre differ up to
    # 7-fold the typical interval spans about a factor of 2.
    assert statistics.median(e.high / e.low for e in trials) < 3.0
    assert all(e.low < e.spread < e.high and not e.exact for e in trials)


def test_the_squared_estimate_is_unbiased_where_the_sample_spread_is_not():
    population = stage_population(100, seed=1)
    truth_squared = replica_spread(population) ** 2
    samples = [random.Random(seed).sample(population, 4) for seed in range(300)]
    mean_estimate = statistics.fmean(estimate_spread(s, population=100).squared for s in samples)
    mean_plug_in = statistics.fmean(replica_spread(s) ** 2 for s in samples)
    assert mean_estimate / truth_squared == pytest.approx(1.0, abs=0.04)
    # The sample's own spread divides by n, not n - 1: about 3/4 of the truth for n = 4.
    assert mean_plug_in / truth_squared < 0.85


def test_the_interval_narrows_as_the_sample_nears_the_whole_stage():
    population = stage_population(20, seed=2)
    order = random.Random(3).sample(population, 20)
    widths = [estimate_spread(order[:n], population=20) for n in (5, 10, 19)]
    assert widths[0].high - widths[0].low > widths[1].high - widths[1].low > widths[2].high - widths[2].low > 0


def test_jackknife_closed_form_equals_leaving_each_replica_out():
    replicas = stage_population(7, seed=4)
    count = len(replicas)

    def unbiased(subset):  # s² = Σ d_j / (n - 1) = replica_spread² · n / (n - 1)
        return replica_spread(subset) ** 2 * len(subset) / (len(subset) - 1)

    whole = unbiased(replicas)
    pseudo = [count * whole - (count - 1) * unbiased(replicas[:j] + replicas[j + 1:]) for j in range(count)]
    expected = statistics.variance(pseudo) / count
    assert jackknife_variance(squared_distances_to_mean(replicas)) == pytest.approx(expected, rel=1e-9)
    with pytest.raises(ValueError):
        jackknife_variance([1.0, 2.0])


def test_too_small_a_sample_of_a_larger_stage_is_unbounded():
    replicas = stage_population(10, seed=5)
    two = estimate_spread(replicas[:2], population=10)
    assert two.spread == pytest.approx(math.sqrt(0.9 * 2 * replica_spread(replicas[:2]) ** 2), rel=1e-9)
    assert (two.low, two.high) == (0.0, math.inf) and not two.exact
    one = estimate_spread(replicas[:1], population=10)
    assert (one.spread, one.low, one.high) == (0.0, 0.0, math.inf)
    with pytest.raises(ValueError):
        estimate_spread(replicas, population=9)


@pytest.mark.parametrize(("dof", "table", "tolerance"), [
    (2, 4.302653, 0.008), (3, 3.182446, 0.0015), (5, 2.570582, 2e-4), (7, 2.364624, 1e-4),
    (30, 2.042272, 1e-5), (1e9, 1.959964, 1e-5)])
def test_student_t_quantile_matches_the_tables(dof, table, tolerance):
    assert student_t_quantile(dof) == pytest.approx(table, rel=tolerance)


def test_student_t_quantile_refuses_what_it_cannot_approximate():
    with pytest.raises(ValueError):
        student_t_quantile(1)


def estimate(squared: float, variance: float, dof: float, sampled: int = 8, population: int = 100) -> SpreadEstimate:
    root = math.sqrt(squared)
    return SpreadEstimate(spread=root, low=root, high=root, sampled=sampled, population=population,
                          squared=squared, squared_variance=variance, dof=dof)


def test_pooling_exact_stages_is_pooled_spread_and_exact():
    pooled = pooled_estimate([estimate(4.0, 0.0, 3), estimate(1.0, 0.0, 1)], [3, 1])
    assert pooled.spread == pytest.approx(pooled_spread([2.0, 1.0], [3, 1]))
    assert pooled.low == pooled.high == pooled.spread and pooled.exact
    assert (pooled.sampled, pooled.population) == (16, 200)


def test_pooling_adds_weighted_variances_with_welch_degrees_of_freedom():
    pooled = pooled_estimate([estimate(4.0, 0.5, 7), estimate(1.0, 0.2, 4)], [1, 1])
    assert pooled.squared == pytest.approx(2.5)
    assert pooled.squared_variance == pytest.approx(0.25 * 0.5 + 0.25 * 0.2)
    parts = [0.125, 0.05]
    assert pooled.dof == pytest.approx(sum(parts) ** 2 / (parts[0] ** 2 / 7 + parts[1] ** 2 / 4))
    assert pooled.low < pooled.spread < pooled.high < math.inf
    unknown = pooled_estimate([estimate(4.0, 0.5, 7), estimate(1.0, math.inf, 1)], [1, 1])
    assert (unknown.low, unknown.high) == (0.0, math.inf)
