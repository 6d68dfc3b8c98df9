"""The α–β cost model of one sync step: ring and tree all-reduce against a pairwise exchange.

Pure functions, no I/O. Per link: α (s) the one-way latency a message pays, β (bytes/s)
the link bandwidth; S the float32 bytes one worker holds, S_wire what the codec sends.

    ring all-reduce (reduce-scatter + all-gather, N−1 steps each, S/N per step):
        T_ring(N) = 2(N−1)·(α + S/(N·β))
    tree / recursive doubling (log2 N rounds of reduce, log2 N of broadcast, whole S):
        T_tree(N) = 2·⌈log2 N⌉·(α + S/β)
    pairwise exchange (NoLoCo: one request/reply with one peer, both directions at once
    on a full-duplex link, independent of N):
        T_pair = α_rt + S_wire/β,   α_rt = 2α (one round trip)

`fit_*` recover (α, 1/β) from measured points by least squares on these linear forms,
clamping a negative coefficient to zero and refitting the other.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Link:
    alpha_s: float
    """One-way latency per message (ring/tree); a round trip is 2·alpha_s unless fitted apart."""
    beta_bytes_per_s: float


def ring_allreduce_s(n: int, size_bytes: float, link: Link) -> float:
    if n < 2:
        return 0.0
    return 2 * (n - 1) * (link.alpha_s + size_bytes / (n * link.beta_bytes_per_s))


def tree_allreduce_s(n: int, size_bytes: float, link: Link) -> float:
    if n < 2:
        return 0.0
    return 2 * math.ceil(math.log2(n)) * (link.alpha_s + size_bytes / link.beta_bytes_per_s)


def pairwise_exchange_s(wire_bytes: float, link: Link, round_trip_s: float | None = None) -> float:
    """One round trip plus the compressed bytes once (sent and received in parallel)."""
    rt = 2 * link.alpha_s if round_trip_s is None else round_trip_s
    return rt + wire_bytes / link.beta_bytes_per_s


def _least_squares_2(xs: Sequence[float], ys: Sequence[float], ts: Sequence[float]) -> tuple[float, float]:
    """(a, b) minimising Σ (a·x + b·y − t)², with a, b ≥ 0 (a clamped one is refitted alone)."""
    sxx = sum(x * x for x in xs)
    syy = sum(y * y for y in ys)
    sxy = sum(x * y for x, y in zip(xs, ys, strict=True))
    sxt = sum(x * t for x, t in zip(xs, ts, strict=True))
    syt = sum(y * t for y, t in zip(ys, ts, strict=True))
    det = sxx * syy - sxy * sxy
    if det > 1e-12 * max(sxx * syy, 1e-300):
        a = (sxt * syy - syt * sxy) / det
        b = (syt * sxx - sxt * sxy) / det
        if a >= 0 and b >= 0:
            return a, b
    # Degenerate or a negative coefficient: the better of the two one-parameter fits.
    only_b = (0.0, max(0.0, syt / syy) if syy else 0.0)
    only_a = (max(0.0, sxt / sxx) if sxx else 0.0, 0.0)

    def sse(ab: tuple[float, float]) -> float:
        return sum((ab[0] * x + ab[1] * y - t) ** 2 for x, y, t in zip(xs, ys, ts, strict=True))

    return min(only_b, only_a, key=sse)


def _link_from(alpha_s: float, inv_beta: float) -> Link:
    return Link(alpha_s=alpha_s, beta_bytes_per_s=1.0 / inv_beta if inv_beta > 0 else math.inf)


def fit_ring(points: Sequence[tuple[int, float, float]]) -> Link:
    """α, β from (N, S bytes, seconds) all-reduce points: t = α·2(N−1) + (1/β)·2(N−1)S/N."""
    xs = [2.0 * (n - 1) for n, _, _ in points]
    ys = [2.0 * (n - 1) * s / n for n, s, _ in points]
    return _link_from(*_least_squares_2(xs, ys, [t for _, _, t in points]))


def fit_pairwise(points: Sequence[tuple[float, float]]) -> tuple[float, Link]:
    """(α_rt, link) from (S_wire bytes, seconds) exchange points: t = α_rt + S_wire/β.
    The returned link's alpha_s is α_rt/2."""
    round_trip, inv_beta = _least_squares_2([1.0] * len(points), [s for s, _ in points], [t for _, t in points])
    return round_trip, _link_from(round_trip / 2, inv_beta)


def crossover_n(ratio: float, allreduce_s: Callable[[int], float], pairwise_s: float, *, max_n: int = 1 << 20) -> int | None:
    """Smallest integer N ≥ 2 with allreduce_s(N) ≥ ratio·pairwise_s (bisection on a
    non-decreasing function: ring and tree times both are), or None if not reached by max_n."""
    if allreduce_s(max_n) < ratio * pairwise_s:
        return None
    lo, hi = 2, max_n
    while lo < hi:
        mid = (lo + hi) // 2
        if allreduce_s(mid) >= ratio * pairwise_s:
            hi = mid
        else:
            lo = mid + 1
    return lo
