"""Matched outer-step groups without coordination (docs/architecture.md §4). Pure: no I/O.

At outer step k every worker of a stage partitions the same sorted list of ONLINE members
with a generator seeded by (run seed, stage, k). Workers whose views agree compute the
same partition, so partners choose each other without a message, everyone is in exactly
one group and the averaging keeps the replicas' mean. The partition is draw_groups, which
the simulator uses too.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence


def matched_partners(members: Sequence[str], me: str, *, seed: int, stage: int, outer_step: int,
                     group_size: int) -> list[str]:
    """The partners of `me` at `outer_step` (its group without itself), from the stage's
    ONLINE member ids as `me` sees them (itself included; order does not matter).

    Raises ValueError when `me` is not among `members`: a worker outside its own view has
    no group (it takes a local step) rather than a partition others would not share.
    """
    ids = sorted(set(members))
    if me not in ids:
        raise ValueError(f"{me!r} is not among the members it partitions")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    rng = step_rng(seed, outer_step, f"outer-groups:{stage}")
    groups = draw_groups(len(ids), "noloco", group_size, rng)
    return [ids[j] for j in groups[ids.index(me)][1:]]


def partition(members: Sequence[str], *, seed: int, stage: int, outer_step: int,
              group_size: int) -> list[list[str]]:
    """The whole partition of `members` at `outer_step` (each group sorted, groups sorted):
    what every worker with this view computes, for tests and diagnostics."""
    groups = {tuple(sorted([me, *matched_partners(members, me, seed=seed, stage=stage, outer_step=outer_step,
                                                  group_size=group_size)])) for me in set(members)}
    return [list(group) for group in sorted(groups)]


def view_digest(members: Sequence[str]) -> str:
    """Eight hex digits naming a set of member ids (order and repeats ignored): two workers
    whose digests for a step agree partitioned the same view, so their groups must agree."""
    return hashlib.blake2b("\n".join(sorted(set(members))).encode(), digest_size=4).hexdigest()


def step_rng(seed: int, step: int, purpose: str) -> random.Random:
    """A generator that depends only on (purpose, run seed, step), as the authors seed their
    routing permutation by the step: draws for one step never shift those of another."""
    return random.Random(f"{purpose}:{seed}:{step}")


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
