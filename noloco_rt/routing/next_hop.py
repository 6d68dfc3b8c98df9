"""Next-hop choice (pure): which live next-stage worker gets a microbatch, from each
peer's round-trip average, our own in-flight count there and its advertised queue depth."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TypeVar

PeerId = TypeVar("PeerId")

HINT_WEIGHT = 0.25
"""Weight of a peer's advertised queue depth: a slow hint (heartbeat-old, and it already
counts our own in-flight microbatches there), so it only tips near-equal choices."""


MIN_RTT_S = 1e-6
"""Floor of a round-trip time, so that in-flight counts still matter for a very fast peer."""


UNMEASURED_RTT_S = 1.0
"""Round-trip time assumed when no peer has been measured yet (any value: all are equal)."""


def exploration_rtt(measured: Sequence[float | None]) -> float:
    """Round-trip time assumed for a peer never measured: the lowest measured one, so a
    newcomer looks as good as the best peer and receives traffic until its own RTT is known."""
    known = [rtt for rtt in measured if rtt is not None]
    return min(known) if known else UNMEASURED_RTT_S


def next_hop_cost(rtt_s: float | None, inflight: int, advertised_depth: int, *, explore_rtt_s: float,
                  hint_weight: float = HINT_WEIGHT) -> float:
    """Expected cost (seconds) of sending one more microbatch to a peer.

    cost = rtt · (1 + inflight + hint_weight · advertised_depth): our microbatch waits
    behind the ones we already have there, each worth about one observed round trip, plus
    a fraction of the queue the peer advertises. rtt is the peer's moving average, or
    explore_rtt_s for a peer never measured.
    """
    rtt = explore_rtt_s if rtt_s is None else rtt_s
    return max(rtt, MIN_RTT_S) * (1 + inflight + hint_weight * advertised_depth)


def next_hop_costs(peers: Sequence[tuple[PeerId, float | None, int, int]]) -> list[tuple[PeerId, float]]:
    """(peer, cost) for (peer, rtt or None, own in-flight, advertised depth), ready for route_next_hop."""
    explore = exploration_rtt([rtt for _, rtt, _, _ in peers])
    return [(peer, next_hop_cost(rtt, inflight, depth, explore_rtt_s=explore)) for peer, rtt, inflight, depth in peers]


def route_next_hop(candidates: Sequence[tuple[PeerId, float]], rng: random.Random, policy: str = "p2c") -> PeerId:
    """Pick the next-stage worker for a microbatch among (peer, cost), lower is better:
    workers pass next_hop_costs, the simulator its queue counts.

    p2c ("power of two choices"): draw two distinct candidates at random and take the
    cheaper one (ties: the first drawn). random: uniform.
    """
    if not candidates:
        raise ValueError("no live next-stage worker to route to")
    if policy == "random" or len(candidates) == 1:
        return rng.choice(candidates)[0]
    if policy != "p2c":
        raise ValueError(f"unknown routing policy {policy!r}")
    first, second = rng.sample(range(len(candidates)), 2)
    return candidates[second][0] if candidates[second][1] < candidates[first][1] else candidates[first][0]
