"""Pure choices of who talks to whom: next-hop routing and outer-step groups."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TypeVar

PeerId = TypeVar("PeerId")


def route_next_hop(candidates: Sequence[tuple[PeerId, int]], rng: random.Random, policy: str = "p2c") -> PeerId:
    """Pick the next-stage worker for a microbatch among (peer, advertised queue depth).

    p2c ("power of two choices"): draw two distinct candidates at random and take the
    one with the shorter queue (ties: the first drawn). random: uniform.
    """
    if not candidates:
        raise ValueError("no live next-stage worker to route to")
    if policy == "random" or len(candidates) == 1:
        return rng.choice(candidates)[0]
    if policy != "p2c":
        raise ValueError(f"unknown routing policy {policy!r}")
    first, second = rng.sample(range(len(candidates)), 2)
    return candidates[second][0] if candidates[second][1] < candidates[first][1] else candidates[first][0]


def draw_groups(num_replicas: int, method: str, group_size: int, rng: random.Random) -> list[list[int]]:
    """The outer-step group of every replica, members[i] starting with i itself.

    noloco: a random partition into groups of group_size, redrawn every call; a
    remainder smaller than group_size joins the last group, so everyone synchronises.
    diloco: everyone. local: {i}. Groups are drawn within one stage.
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
