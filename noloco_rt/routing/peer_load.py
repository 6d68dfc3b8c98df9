"""What a worker observes of its next-stage peers: its own microbatches in flight at each,
and a moving average of their round-trip times (docs/architecture.md §3: the routing signal is local,
so Redis is never in a routing decision's path).

Pure bookkeeping: the caller measures the round trips (the clock that ages them is injectable).
"""

from __future__ import annotations

import time
from collections.abc import Callable

RTT_EMA_WEIGHT = 0.3
"""Weight of the newest round trip in the moving average: a peer that slows down (or
recovers) shows it within a few microbatches."""


STALE_MIN_S = 1.0
STALE_RTTS = 4.0
"""A peer's average is forgotten once nothing of ours is in flight there and it has taught us
nothing for max(STALE_MIN_S, STALE_RTTS x that average). Only sending to a peer measures it:
a peer passed over as slow (its first round trips held a compile or a bootstrap it served)
would otherwise keep its old figure and get nothing for the rest of the run. Forgotten, it
looks as good as the best peer, gets its share, and is measured afresh; a peer still slow
costs one microbatch's wait per period, a period that grows with how slow it was."""


class PeerLoad:
    """In-flight counts and round-trip moving averages, per peer worker id."""

    def __init__(self, *, ema_weight: float = RTT_EMA_WEIGHT, clock: Callable[[], float] = time.monotonic) -> None:
        if not 0.0 < ema_weight <= 1.0:
            raise ValueError(f"ema_weight must be in (0, 1], got {ema_weight}")
        self.ema_weight = ema_weight
        self._clock = clock
        self._inflight: dict[str, int] = {}
        self._rtt: dict[str, float] = {}
        self._learnt_at: dict[str, float] = {}

    def sent(self, worker_id: str) -> None:
        """A microbatch went to this peer: it counts toward the peer's load until it returns."""
        self._inflight[worker_id] = self._inflight.get(worker_id, 0) + 1

    def returned(self, worker_id: str, rtt_s: float | None = None) -> None:
        """A microbatch sent to this peer came back after rtt_s, or was given up on after
        rtt_s (the time it was owed counts as a slow round trip, so a peer that never
        answers looks slow); None: no time to learn from."""
        remaining = self._inflight.get(worker_id, 0) - 1
        if remaining > 0:
            self._inflight[worker_id] = remaining
        else:
            self._inflight.pop(worker_id, None)
        if rtt_s is not None:
            self.observe(worker_id, rtt_s)

    def observe(self, worker_id: str, rtt_s: float) -> None:
        """Fold one round trip (seconds) into the peer's moving average."""
        if rtt_s < 0:
            raise ValueError(f"a round trip cannot be negative, got {rtt_s}")
        previous = self.rtt_ema(worker_id)  # a forgotten average starts again from this round trip
        self._rtt[worker_id] = rtt_s if previous is None else previous + self.ema_weight * (rtt_s - previous)
        self._learnt_at[worker_id] = self._clock()

    def inflight(self, worker_id: str) -> int:
        return self._inflight.get(worker_id, 0)

    def rtt_ema(self, worker_id: str) -> float | None:
        """The peer's average round trip, or None if none was measured or it is stale (STALE_RTTS)."""
        rtt = self._rtt.get(worker_id)
        if rtt is None or self.inflight(worker_id) > 0:
            return rtt
        stale_after = max(STALE_MIN_S, STALE_RTTS * rtt)
        return None if self._clock() - self._learnt_at[worker_id] > stale_after else rtt
