"""Matched outer-step groups without coordination (docs/architecture.md §4). Pure: no I/O.

At outer step k every worker of a stage partitions the same sorted list of ONLINE members
with a generator seeded by (run seed, stage, k). Workers whose views agree compute the
same partition, so partners choose each other without a message, everyone is in exactly
one group and the averaging keeps the replicas' mean. The partition is draw_groups, the
one the simulator uses.
"""

from __future__ import annotations

from collections.abc import Sequence

from noloco_rt.algo.routing import draw_groups, step_rng


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
