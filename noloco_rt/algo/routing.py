"""Pure choices of who talks to whom: next-hop routing, the simulator's routes of one
inner step, and outer-step groups."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TypeVar

PeerId = TypeVar("PeerId")
Path = list[int]
"""A route through the pipeline: the replica index at every stage, path[0] the stage-0 origin."""


def step_rng(seed: int, step: int, purpose: str) -> random.Random:
    """A generator that depends only on (purpose, run seed, step), as the authors seed their
    routing permutation by the step: draws for one step never shift those of another."""
    return random.Random(f"{purpose}:{seed}:{step}")


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


def balanced_routes(replicas: int, stages: int, per_replica: int, rng: random.Random) -> list[Path]:
    """Paths of one inner step in which every replica of every stage receives exactly
    per_replica units (microbatches, or sequences when routing per sequence).

    Unit k starts at stage-0 replica k // per_replica (so paths[origin·per_replica + j] is
    the j-th unit of `origin`); at every later stage one permutation π of the R·per_replica
    units, drawn from rng, sends unit k to replica π[k] // per_replica.
    """
    if replicas < 1 or stages < 1 or per_replica < 1:
        raise ValueError(f"need replicas, stages, per_replica >= 1, got {replicas}, {stages}, {per_replica}")
    units = replicas * per_replica
    paths = [[k // per_replica] for k in range(units)]
    for _ in range(1, stages):
        slots = list(range(units))
        rng.shuffle(slots)
        for path, slot in zip(paths, slots, strict=True):
            path.append(slot // per_replica)
    return paths


def load_aware_routes(replicas: int, stages: int, per_replica: int, rng: random.Random,
                      policy: str) -> list[Path]:
    """Paths of one inner step routed hop by hop as workers do (route_next_hop on the
    microbatches each replica has received so far this step), in the order of
    balanced_routes. Shares are unequal: a replica may receive nothing."""
    load = [[0] * replicas for _ in range(stages)]
    paths = []
    for origin in range(replicas):
        for _ in range(per_replica):
            path = [origin]
            for stage in range(1, stages):
                path.append(route_next_hop([(j, load[stage][j]) for j in range(replicas)], rng, policy))
            for stage, index in enumerate(path):
                load[stage][index] += 1
            paths.append(path)
    return paths


def draw_groups(num_replicas: int, method: str, group_size: int, rng: random.Random) -> list[list[int]]:
    """The outer-step group of every replica, members[i] starting with i itself.

    noloco: a random partition into groups of group_size, redrawn every call; a
    remainder smaller than group_size joins the last group, so everyone synchronises.
    diloco: everyone. local: {i}. Groups are drawn within one stage.
    An odd count therefore forms one group of three where the authors' code refuses odd
    R: an elastic runtime sees odd counts, and everyone should still synchronise.
    """
    if method == "local" or num_replicas == 1:
        return [[i] for i in range(num_replicas)]
    if method == "diloco":
        everyone = list(range(num_replicas))
        return [[i] + [j for j in everyone if j != i] for i in everyone]
    if method != "noloco":
        raise ValueError(f"method {method!r} has no outer groups")
    order = list(range(num_replicas))
    rng.shuffle(order)
    size = min(group_size, num_replicas)
    partition = [order[k:k + size] for k in range(0, num_replicas, size)]
    if len(partition) > 1 and len(partition[-1]) < size:
        partition[-2].extend(partition.pop())
    groups: list[list[int]] = [[] for _ in range(num_replicas)]
    for members in partition:
        for i in members:
            groups[i] = [i] + [j for j in members if j != i]
    return groups


def random_peers(num_replicas: int, rng: random.Random) -> list[list[int]]:
    """The old runtime's pairing: members[i] = [i, j], j drawn uniformly among the other
    replicas, independently for every i (one replica: [[0]]).

    Not a matching: a replica may be drawn by several others or by none, and j need not
    draw i back, so the averaging no longer keeps the replicas' mean. For ablations
    against draw_groups' matched groups, in the simulator only.
    """
    if num_replicas < 1:
        raise ValueError(f"need at least one replica, got {num_replicas}")
    if num_replicas == 1:
        return [[0]]
    groups = []
    for i in range(num_replicas):
        j = rng.randrange(num_replicas - 1)
        groups.append([i, j + (j >= i)])  # uniform over the others: skip i itself
    return groups
