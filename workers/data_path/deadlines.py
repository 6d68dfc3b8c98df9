"""Per-microbatch deadlines derived from observed round-trip latencies (pure logic).

A deadline is a multiple of a high quantile of recent round trips, clamped between a
floor (so a quiet link is not declared dead after a lucky fast sample) and a ceiling
(so a dead peer is noticed in bounded time).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class DeadlinePolicy:
    floor_s: float = 2.0
    ceiling_s: float = 30.0
    multiplier: float = 4.0
    """Deadline = multiplier × quantile of observed round trips."""
    quantile: float = 0.95
    window: int = 64
    """Round trips remembered."""
    initial_s: float = 10.0
    """Used until a first round trip has been observed (start-up includes peers' warm-up)."""

    def __post_init__(self) -> None:
        if not 0 < self.floor_s <= self.initial_s <= self.ceiling_s:
            raise ValueError("need 0 < floor_s <= initial_s <= ceiling_s")
        if self.multiplier < 1 or not 0 < self.quantile <= 1 or self.window < 1:
            raise ValueError("need multiplier >= 1, quantile in (0, 1], window >= 1")


class LatencyTracker:
    def __init__(self, policy: DeadlinePolicy | None = None) -> None:
        self.policy = policy or DeadlinePolicy()
        self._samples: deque[float] = deque(maxlen=self.policy.window)

    def observe(self, round_trip_s: float) -> None:
        if round_trip_s >= 0:
            self._samples.append(round_trip_s)

    def deadline_s(self) -> float:
        return deadline_from_samples(list(self._samples), self.policy)


def deadline_from_samples(samples: list[float], policy: DeadlinePolicy) -> float:
    if not samples:
        return policy.initial_s
    ordered = sorted(samples)
    index = min(len(ordered) - 1, int(policy.quantile * len(ordered)))
    return min(policy.ceiling_s, max(policy.floor_s, policy.multiplier * ordered[index]))
