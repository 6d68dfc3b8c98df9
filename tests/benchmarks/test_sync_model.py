"""The pure α–β model of benchmarks/sync/model.py: formulas, fitting, crossover search."""

from __future__ import annotations

import math

import pytest

from benchmarks.sync import model
from benchmarks.sync.model import Link

LINK = Link(alpha_s=0.025, beta_bytes_per_s=12.5e6)


def test_ring_allreduce_formula() -> None:
    # 2(N−1)(α + S/(Nβ)) with N=4, S=100 MB: 6·(0.025 + 2 s) = 12.15 s
    assert model.ring_allreduce_s(4, 100e6, LINK) == pytest.approx(12.15)
    assert model.ring_allreduce_s(1, 100e6, LINK) == 0.0


def test_tree_allreduce_formula_rounds_up_log2() -> None:
    # 2·⌈log2 N⌉·(α + S/β): N=5 takes 3 rounds each way
    assert model.tree_allreduce_s(5, 12.5e6, LINK) == pytest.approx(6 * 1.025)
    assert model.tree_allreduce_s(8, 12.5e6, LINK) == pytest.approx(6 * 1.025)


def test_pairwise_is_one_round_trip_plus_wire_bytes() -> None:
    assert model.pairwise_exchange_s(25e6, LINK) == pytest.approx(0.05 + 2.0)
    assert model.pairwise_exchange_s(25e6, LINK, round_trip_s=0.2) == pytest.approx(0.2 + 2.0)


def test_fit_ring_recovers_alpha_beta() -> None:
    truth = Link(alpha_s=0.013, beta_bytes_per_s=40e6)
    points = [(n, s, model.ring_allreduce_s(n, s, truth)) for n in (2, 4, 8) for s in (1e6, 2e7, 1e8)]
    fitted = model.fit_ring(points)
    assert fitted.alpha_s == pytest.approx(truth.alpha_s, rel=1e-6)
    assert fitted.beta_bytes_per_s == pytest.approx(truth.beta_bytes_per_s, rel=1e-6)


def test_fit_pairwise_recovers_round_trip_and_beta() -> None:
    truth = Link(alpha_s=0.04, beta_bytes_per_s=9e6)
    points = [(s, model.pairwise_exchange_s(s, truth)) for s in (1e5, 3e6, 4e7)]
    round_trip, fitted = model.fit_pairwise(points)
    assert round_trip == pytest.approx(0.08, rel=1e-6)
    assert fitted.beta_bytes_per_s == pytest.approx(9e6, rel=1e-6)


def test_fit_clamps_negative_latency_to_zero() -> None:
    # Times slightly below pure bandwidth would need α < 0: clamp and refit β alone.
    points = [(s, s / 1e7 - 0.01) for s in (1e6, 1e7, 1e8)]
    round_trip, fitted = model.fit_pairwise(points)
    assert round_trip == 0.0
    assert fitted.beta_bytes_per_s == pytest.approx(1e7, rel=0.01)


def test_crossover_finds_smallest_n() -> None:
    # allreduce(N) = N seconds, pairwise 1 s: 10× at N = 10 exactly
    assert model.crossover_n(10, float, 1.0) == 10
    assert model.crossover_n(10, lambda n: 5.0, 1.0) is None
    assert model.crossover_n(10, lambda n: 50.0, 1.0) == 2


def test_crossover_on_ring_model_matches_closed_form() -> None:
    size = 1e6
    pair = model.pairwise_exchange_s(size, LINK)
    n = model.crossover_n(10, lambda k: model.ring_allreduce_s(k, size, LINK), pair)
    assert n is not None
    assert model.ring_allreduce_s(n, size, LINK) >= 10 * pair > model.ring_allreduce_s(n - 1, size, LINK)
    # Large N: ring ≈ 2(N−1)α + 2S/β, so N ≈ (10·pair − 2S/β)/(2α) + 1
    approx = (10 * pair - 2 * size / LINK.beta_bytes_per_s) / (2 * LINK.alpha_s) + 1
    assert abs(n - approx) <= math.ceil(0.05 * approx)
