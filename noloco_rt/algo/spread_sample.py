"""Replica spread estimated from a random sample of a stage's replicas, with a 95% interval.

The coordinator cannot pull every replica of a large stage each cycle: it pulls a
simple random sample (without replacement) of n of the stage's N live replicas and
estimates what replica_spread (noloco_rt.algo.diagnostics) would give over all N:

    spread² = Σ_i ‖x_i − x̄‖² / (N · P)        x_i: replica i's P parameters, x̄ their mean

Estimator. With d_j = ‖x_j − x̄_s‖² / P over the sample (x̄_s the sample's mean),
s² = Σ_j d_j / (n − 1) is unbiased, under sampling without replacement, for
Σ_i ‖x_i − x̄‖² / ((N − 1) · P); so θ = (N − 1)/N · s² is unbiased for spread². The spread
reported is √θ (a little low for small n, as any square root of an unbiased variance).
When n = N, θ is the sample's own spread² exactly.

Interval. s² is a U-statistic of the sampled replicas (the unit sampled is a replica, not a
parameter, so parameters within a replica are never treated as independent). Its delete-one
jackknife pseudo-values have the closed form (n·d_j − s²)/(n − 2); their variance over n
estimates Var(s²), times the finite-population correction (1 − n/N), which is 0 when the
sample is the whole stage: the interval then collapses to the point. The 95% interval is
formed on the log scale (θ is positive and right-skewed for small n) with a Student-t
quantile on n − 1 degrees of freedom, then square-rooted. Fewer than 3 replicas sampled from
a larger stage leave the variance unknown: the interval is (0, inf). A rare replica far from
the others that the sample misses is invisible to any interval built from the sample.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import torch

CONFIDENCE = 0.95
MAX_LOG_HALF_WIDTH = 700.0
"""exp() overflows a float beyond ~709: a wider log-scale interval is as good as unbounded."""


@dataclass(frozen=True)
class SpreadEstimate:
    """The spread of one stage (or of several, pooled) estimated from sampled replicas."""

    spread: float
    """Point estimate: √θ, θ the unbiased estimate of spread²."""
    low: float
    high: float
    """The 95% interval of the spread; high is math.inf when the sample cannot bound it."""
    sampled: int
    """Replicas the estimate is computed from."""
    population: int
    """Live replicas the sample was drawn from."""
    squared: float
    """θ, the unbiased estimate of spread²."""
    squared_variance: float
    """Estimated variance of θ: 0 when exact (the whole stage), inf when unknown."""
    dof: float
    """Degrees of freedom of the interval's t quantile."""

    @property
    def exact(self) -> bool:
        return self.squared_variance == 0.0


def student_t_quantile(dof: float, confidence: float = CONFIDENCE) -> float:
    """t such that P(|T| ≤ t) = confidence for T Student-t with `dof` degrees of freedom
    (dof ≥ 2, not necessarily whole: Welch–Satterthwaite gives fractions).

    Cornish–Fisher expansion of the t quantile in powers of 1/dof around the normal one
    (Abramowitz & Stegun 26.7.5); at 95%: at most 0.75% below the exact value at dof = 2,
    0.12% at 3, 0.02% from 5.
    """
    if dof < 2:
        raise ValueError(f"dof must be >= 2 for this approximation, got {dof}")
    z = statistics.NormalDist().inv_cdf(0.5 + confidence / 2)
    terms = [(z ** 3 + z) / 4,
             (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96,
             (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384,
             (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160]
    return z + sum(term / dof ** (power + 1) for power, term in enumerate(terms))


@torch.no_grad()
def squared_distances_to_mean(replicas: Sequence[Sequence[torch.Tensor]]) -> list[float]:
    """Per replica ‖x_j − x̄‖² / P, x̄ the mean of `replicas` (float64, one tensor at a time).

    Their mean is replica_spread(replicas)².
    """
    if not replicas:
        raise ValueError("distances of no replicas")
    count = len(replicas)
    totals = torch.zeros(count, dtype=torch.float64)
    numel = 0
    for tensors in zip(*replicas, strict=True):
        stacked = torch.stack([t.detach().double() for t in tensors])  # (R, *shape)
        totals += ((stacked - stacked.mean(dim=0)) ** 2).reshape(count, -1).sum(dim=1)
        numel += tensors[0].numel()
    return (totals / numel).tolist() if numel else [0.0] * count


def jackknife_variance(distances: Sequence[float]) -> float:
    """Delete-one jackknife estimate of Var(s²), s² = Σ d_j / (n − 1), from the sample's
    d_j (squared_distances_to_mean); n ≥ 3. Pseudo-values in closed form: no refits."""
    count = len(distances)
    if count < 3:
        raise ValueError(f"the jackknife of s² needs at least 3 replicas, got {count}")
    unbiased = sum(distances) / (count - 1)
    pseudo = [(count * d - unbiased) / (count - 2) for d in distances]
    return statistics.variance(pseudo) / count


def estimate_spread(replicas: Sequence[Sequence[torch.Tensor]], population: int) -> SpreadEstimate:
    """The spread of a stage of `population` live replicas from `replicas`, a simple random
    sample of them (all of them: exact, the interval is the point)."""
    sampled = len(replicas)
    if not 1 <= sampled <= population:
        raise ValueError(f"a sample of {sampled} replicas from a stage of {population}")
    distances = squared_distances_to_mean(replicas)
    if sampled == population:
        return _with_interval(sum(distances) / sampled, 0.0, max(sampled - 1, 1), sampled, population)
    if sampled == 1:  # one replica shows no spread at all: nothing is known
        return _with_interval(0.0, math.inf, 1, sampled, population)
    scale = (population - 1) / population
    squared = scale * sum(distances) / (sampled - 1)
    if sampled == 2:
        return _with_interval(squared, math.inf, 1, sampled, population)
    correction = 1.0 - sampled / population
    variance = scale * scale * correction * jackknife_variance(distances)
    return _with_interval(squared, variance, sampled - 1, sampled, population)


def pooled_estimate(estimates: Sequence[SpreadEstimate], numels: Sequence[int]) -> SpreadEstimate:
    """One estimate over several stages, each weighted by its parameter count (as pooled_spread).

    θ = Σ w_k θ_k with w_k the stage's share of the parameters; the stages are sampled
    independently, so Var θ = Σ w_k² Var θ_k, with Welch–Satterthwaite degrees of freedom.
    """
    total = sum(numels)
    weights = [n / total if total else 0.0 for n in numels]
    squared = sum(w * e.squared for w, e in zip(weights, estimates, strict=True))
    parts = [w * w * e.squared_variance for w, e in zip(weights, estimates, strict=True)]
    dof = _welch_dof(parts, [e.dof for e in estimates])
    return _with_interval(squared, sum(parts), dof, sum(e.sampled for e in estimates),
                          sum(e.population for e in estimates))


def finite_or_none(bound: float) -> float | None:
    """An interval bound for JSON, where an unbounded one (inf) is null."""
    return None if math.isinf(bound) else bound


def _welch_dof(parts: Sequence[float], dofs: Sequence[float]) -> float:
    """Degrees of freedom of a sum of independent variance estimates (Welch–Satterthwaite)."""
    finite = [(part, dof) for part, dof in zip(parts, dofs, strict=True) if 0.0 < part < math.inf]
    if not finite:
        return min(dofs, default=1)
    welch = sum(part for part, _ in finite) ** 2 / sum(part * part / dof for part, dof in finite)
    return max(welch, min(dof for _, dof in finite))  # never below its least certain term (rounding)


def _with_interval(squared: float, variance: float, dof: float, sampled: int, population: int) -> SpreadEstimate:
    low, high = _log_interval(squared, variance, dof)
    return SpreadEstimate(spread=math.sqrt(squared), low=math.sqrt(low), high=math.sqrt(high), sampled=sampled,
                          population=population, squared=squared, squared_variance=variance, dof=dof)


def _log_interval(squared: float, variance: float, dof: float) -> tuple[float, float]:
    """95% interval of θ: θ · exp(∓ t · se/θ), the delta method on log θ."""
    if math.isinf(variance):
        return 0.0, math.inf
    if variance == 0.0 or squared <= 0.0:  # θ = 0 means every d_j = 0, hence a zero variance too
        return squared, squared
    half_width = student_t_quantile(dof) * math.sqrt(variance) / squared
    if half_width > MAX_LOG_HALF_WIDTH:
        return 0.0, math.inf
    return squared * math.exp(-half_width), squared * math.exp(half_width)
