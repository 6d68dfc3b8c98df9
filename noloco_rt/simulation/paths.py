"""The simulator's paths through the stages (pure): balanced, hop by hop as workers route,
and the old runtime's unmatched pairing for ablations."""

from __future__ import annotations

import random

from noloco_rt.routing.next_hop import route_next_hop

Path = list[int]
"""A route through the pipeline: the replica index at every stage, path[0] the stage-0 origin."""


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


def site_of(replica: int, replicas: int, sites: int) -> int:
    """The site of a replica when a stage's replicas are split into `sites` equal, contiguous
    groups (replicas 0..R/S-1 at site 0, and so on)."""
    return replica * sites // replicas


def local_routes(replicas: int, stages: int, per_replica: int, rng: random.Random, *, sites: int,
                 far_share: float) -> list[Path]:
    """balanced_routes over `sites` equal groups of replicas, most units staying in their site.

    At every hop, each site sends far_share · its units of them, chosen at random, to one other
    site (the same count and offset for every site this hop, drawn from rng, so each site also
    receives as many as it sends; a fractional count is rounded up with the probability of its
    fraction, so that few units per site still cross at far_share on average); the rest stay. Within a site, one permutation of what it
    holds deals the units to its replicas, so every replica of every stage still receives
    exactly per_replica units. far_share = 1 - 1/sites is about what uniform routing crosses;
    0 cuts the sites apart between outer steps."""
    if sites < 1 or replicas % sites:
        raise ValueError(f"{replicas} replicas do not split into {sites} equal sites")
    if not 0.0 <= far_share <= 1.0:
        raise ValueError(f"far_share must be in [0, 1], got {far_share}")
    per_site = replicas // sites
    units = replicas * per_replica
    share = far_share * per_site * per_replica if sites > 1 else 0.0
    paths = [[k // per_replica] for k in range(units)]
    for _ in range(1, stages):
        crossing = int(share) + (rng.random() < share - int(share))
        offset = rng.randrange(1, sites) if sites > 1 else 0
        arriving: list[list[int]] = [[] for _ in range(sites)]
        for site in range(sites):
            held = [k for k in range(units) if site_of(paths[k][-1], replicas, sites) == site]
            far = set(rng.sample(held, crossing))
            arriving[(site + offset) % sites].extend(k for k in held if k in far)
            arriving[site].extend(k for k in held if k not in far)
        for site, held in enumerate(arriving):
            slots = list(range(len(held)))
            rng.shuffle(slots)
            for k, slot in zip(held, slots, strict=True):
                paths[k].append(site * per_site + slot // per_replica)
    return paths


def fixed_routes(replicas: int, stages: int, per_replica: int) -> list[Path]:
    """Paths of one inner step without routing: unit k of stage-0 replica i stays on replica
    i at every stage, so each column of the pipeline trains alone between outer steps (the
    paper's ablation of random routing). In the order of balanced_routes."""
    if replicas < 1 or stages < 1 or per_replica < 1:
        raise ValueError(f"need replicas, stages, per_replica >= 1, got {replicas}, {stages}, {per_replica}")
    return [[k // per_replica] * stages for k in range(replicas * per_replica)]


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
