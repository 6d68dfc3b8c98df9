"""The simulator's routing of one inner step: which rows of which microbatch take which path.

Pure: the routes come from routing.py and a generator passed in. balanced routes whole
microbatches and balanced-sequence single sequences (the authors' granularity) through
seeded permutations, so every replica of every stage gets exactly its share and takes
its inner step; fixed keeps each microbatch on its origin's replica index at every stage
(no routing: the ablation); p2c and random route microbatches hop by hop as workers do.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from noloco_rt.config import SIMULATION_ROUTINGS
from noloco_rt.simulation.paths import (
    Path,
    balanced_routes,
    fixed_routes,
    load_aware_routes,
    local_routes,
)


@dataclass(frozen=True)
class Hop:
    """One forward and backward pass: `rows` of stage-0 replica `origin`'s microbatch
    `microbatch` along `path`, its mean loss scaled by `loss_weight` before backward."""

    origin: int
    microbatch: int
    path: tuple[int, ...]
    rows: tuple[int, ...]
    loss_weight: float


@dataclass(frozen=True)
class StepPlan:
    hops: list[Hop]
    grads_are_means: bool
    """True: the loss weights make every replica's summed gradient the mean over its share
    (balanced: each share is exactly batch_size · microbatches sequences). False: each
    replica divides by the microbatches it happened to receive."""


def group_by_path(paths: Sequence[Path]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Rows (indices into `paths`) that share a path, one entry per distinct path in order
    of first appearance: the sub-batches one microbatch splits into."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for row, path in enumerate(paths):
        groups.setdefault(tuple(path), []).append(row)
    return [(path, tuple(rows)) for path, rows in groups.items()]


def plan_step(routing: str, *, replicas: int, stages: int, microbatches: int, batch_size: int,
              rng: random.Random, sites: int = 1, far_share: float = 0.0) -> StepPlan:
    """The passes of one inner step, stage-0 replicas in order, each feeding `microbatches`
    microbatches of `batch_size` sequences (`sites` and `far_share`: routing local's)."""
    if routing not in SIMULATION_ROUTINGS:
        raise ValueError(f"unknown simulator routing {routing!r}; expected one of {', '.join(SIMULATION_ROUTINGS)}")
    share = microbatches * batch_size  # sequences every replica of every stage processes per step
    if routing == "balanced-sequence":
        # unit (origin·microbatches + microbatch)·batch_size + row: one sequence
        paths = balanced_routes(replicas, stages, share, rng)
        hops = []
        for origin in range(replicas):
            for microbatch in range(microbatches):
                first = (origin * microbatches + microbatch) * batch_size
                for path, rows in group_by_path(paths[first:first + batch_size]):
                    hops.append(Hop(origin, microbatch, path, rows, loss_weight=len(rows) / share))
        return StepPlan(hops=hops, grads_are_means=True)
    if routing == "balanced":
        paths = balanced_routes(replicas, stages, microbatches, rng)
    elif routing == "local":
        paths = local_routes(replicas, stages, microbatches, rng, sites=sites, far_share=far_share)
    elif routing == "fixed":
        paths = fixed_routes(replicas, stages, microbatches)
    else:  # p2c or random: the workers' policies
        paths = load_aware_routes(replicas, stages, microbatches, rng, routing)
    balanced = routing in ("balanced", "local", "fixed")  # every replica gets exactly its share
    all_rows = tuple(range(batch_size))
    hops = [Hop(k // microbatches, k % microbatches, tuple(path), all_rows,
                loss_weight=1.0 / microbatches if balanced else 1.0) for k, path in enumerate(paths)]
    return StepPlan(hops=hops, grads_are_means=balanced)
