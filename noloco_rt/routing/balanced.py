"""Balanced next-hop choice (pure): an origin step's microbatches dealt evenly over the live
next-stage workers, as the simulator's balanced routes do (DESIGN §4 "Drift").

Every sender of a stage draws the same permutation π of the next stage's live workers for
an origin step (seeded by run, stage and step, no message needed). Sender r's microbatch j
of that step goes to π[(r·B + j) mod R], B microbatches per sender and step, R receivers:
the U senders together fill U·B consecutive slots, so every receiver gets ⌊U·B/R⌋ or
⌈U·B/R⌉ of the step's microbatches, and π changes every step so that who feeds whom is mixed.
Views that differ for a moment (a join, a death) only make the deal a little uneven.

Workers that name their site (worker.site) deal within it: each slot leaves the site with
probability far_share (a coin seeded by the slot), and is otherwise dealt among the next
stage's workers of the sender's own site, the sender ranked among its site's workers; a
site without next-stage workers, or a far slot with no other site live, deals among all.

A dealt worker that has become slow (its expected cost several times the cheapest
candidate's: a straggler, a stopped process, a link that degraded) is passed over for the
load-aware choice, so balance never waits on a bad worker.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from noloco_rt.routing.next_hop import route_next_hop

PeerId = TypeVar("PeerId")

SLOW_FACTOR = 3.0
"""A dealt worker whose expected cost exceeds this many times the cheapest candidate's is
passed over. Round-trip averages of equal workers differ by well under 2x even on a shared
CPU; a straggler's grow with the microbatches queued at it."""


@dataclass(frozen=True)
class DealSlot:
    """One microbatch's place in its origin step's deal."""

    seed: int
    stage: int
    """The sending stage (senders of one stage share the permutation)."""
    step: int
    """The stage-0 inner step the microbatch's data belongs to."""
    sender_rank: int
    """The sender's index among its stage's live workers, sorted by id."""
    per_sender: int
    """Microbatches each sender deals per step (B)."""
    index: int
    """This microbatch's index among the sender's for `step` (0..B-1; more wrap around)."""

    def receiver(self, receivers: int) -> int:
        """Index of the receiver, among `receivers` sorted by id, that this slot goes to."""
        if receivers < 1:
            raise ValueError(f"no receiver to deal to (receivers={receivers})")
        position = (self.sender_rank * self.per_sender + self.index) % receivers
        return step_permutation(self.seed, self.stage, self.step, receivers)[position]


@functools.lru_cache(maxsize=256)
def step_permutation(seed: int, stage: int, step: int, receivers: int) -> tuple[int, ...]:
    """The permutation of range(receivers) every sender of `stage` uses at origin `step`."""
    order = list(range(receivers))
    random.Random(f"route:{seed}:{stage}:{step}").shuffle(order)
    return tuple(order)


def goes_far(slot: DealSlot, far_share: float) -> bool:
    """Whether this slot's microbatch leaves its sender's site: seeded by the slot, so that a
    stage's senders cross at far_share on average and a slot decides alike every time."""
    if far_share <= 0.0 or far_share >= 1.0:
        return far_share >= 1.0
    coin = random.Random(f"far:{slot.seed}:{slot.stage}:{slot.step}:{slot.sender_rank}:{slot.index}")
    return coin.random() < far_share


def balanced_next_hop(candidates: Sequence[tuple[PeerId, float]], slot: DealSlot, rng: random.Random, *,
                      slow_factor: float = SLOW_FACTOR) -> tuple[PeerId, bool]:
    """(receiver, passed_over) for one microbatch among (peer, cost) sorted by peer id: the
    dealt peer, or, when it is slow, the load-aware (p2c) choice with passed_over True."""
    if not candidates:
        raise ValueError("no live next-stage worker to route to")
    dealt, cost = candidates[slot.receiver(len(candidates))]
    cheapest = min(c for _, c in candidates)
    if cost > slow_factor * cheapest:
        return route_next_hop(candidates, rng, "p2c"), True
    return dealt, False
