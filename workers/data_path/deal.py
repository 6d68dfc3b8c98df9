"""This sender's place in the balanced deal (noloco_rt/routing/balanced.py): how many of each
origin step's microbatches it has dealt so far, so the next one takes the next slot."""

from __future__ import annotations

from collections.abc import Callable

from noloco_rt.routing.balanced import DealSlot

KEEP_STEPS = 8
"""Origin steps whose counts are kept: a middle stage may hold forwards of a few steps at once."""


class DealPosition:
    def __init__(self, *, seed: int, stage: int, per_sender: int, rank: Callable[[], int]) -> None:
        self.seed = seed
        self.stage = stage
        self.per_sender = per_sender
        self.rank = rank
        """Our index among our stage's live workers (read at each slot: the view changes)."""
        self._dealt: dict[int, int] = {}

    def slot(self, origin_step: int) -> DealSlot:
        """The slot the next microbatch of `origin_step` takes (call taken() once it is sent)."""
        return DealSlot(seed=self.seed, stage=self.stage, step=origin_step, sender_rank=self.rank(),
                        per_sender=self.per_sender, index=self._dealt.get(origin_step, 0))

    def taken(self, origin_step: int) -> None:
        self._dealt[origin_step] = self._dealt.get(origin_step, 0) + 1
        for old in [step for step in self._dealt if step <= origin_step - KEEP_STEPS]:
            del self._dealt[old]
