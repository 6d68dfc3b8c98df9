"""What each round decided about each partner, and what partners told us they kept: the
record that settles a lost acknowledgement (docs/architecture.md §4, "Confirmation").

A partner's state is used only when its push reached us and ours was acknowledged. An
acknowledgement lost on the way back (a partition, a stopped process at that instant) leaves
the pusher unsure while its partner, which kept the push, may use it: one-sided. So the
unsure side asks its partner, carrying what the lost acknowledgement would have said the
other way ("I kept yours"): the partner answers with its decision once made. Either side's
question is, for the one asked, the acknowledgement of its own push, so two unsure sides
settle each other: both use, or, once either decided without it, neither. A worker that
finishes or leaves tells the partners of its last round its decisions unasked, since it
will not be there to answer.

Shared by the exchange server's thread (answers) and the exchanger's (decisions), so
every read and write takes the lock.
"""

from __future__ import annotations

import enum
import threading

KEEP_STEPS = 8
"""Outer steps a decision is remembered after its round: a question comes within the
collection window of the round it asks about."""

MAX_RECORDS = 256
"""A flood of questions from made-up senders must not grow memory."""


class Verdict(enum.StrEnum):
    USED = "used"
    DECLINED = "declined"
    PENDING = "pending"
    """Our round has not decided yet: ask again."""
    UNKNOWN = "unknown"
    """A round long over, or never ours: the asker declines."""


class PairVerdicts:
    """Decisions by (partner, outer step), and the partners that told us they kept ours."""

    def __init__(self) -> None:
        self._decided: dict[tuple[str, int], bool] = {}
        self._kept_ours: set[tuple[str, int]] = set()
        self._told: dict[tuple[str, int], bool] = {}
        """Partners' decisions on our push, told us unasked (a partner that finished or left)."""
        self._floor = 0
        """Rounds below this one are over (every decision of theirs is recorded)."""
        self._changed = threading.Condition()

    def decide(self, partner: str, outer_step: int, used: bool) -> None:
        """Our round's final word on `partner`'s state for `outer_step`."""
        with self._changed:
            self._decided[(partner, outer_step)] = used
            self._changed.notify_all()

    def decision(self, partner: str, outer_step: int) -> bool | None:
        with self._changed:
            return self._decided.get((partner, outer_step))

    def kept_ours(self, partner: str, outer_step: int) -> bool:
        """Whether `partner` told us it kept our push for `outer_step` (an acknowledgement)."""
        with self._changed:
            return (partner, outer_step) in self._kept_ours

    def note_told(self, partner: str, outer_step: int, used: bool) -> None:
        """`partner` told us, unasked, whether it used our push for our step `outer_step`."""
        with self._changed:
            self._told[(partner, outer_step)] = used
            self._bound()
            self._changed.notify_all()

    def told(self, partner: str, outer_step: int) -> bool | None:
        with self._changed:
            return self._told.get((partner, outer_step))

    def answer(self, asker: str, outer_step: int) -> Verdict:
        """The reply to `asker`, which kept our push for `outer_step` and asks whether we use
        its: our decision if made; else we note its word (our push is acknowledged) and it
        asks again."""
        with self._changed:
            decided = self._decided.get((asker, outer_step))
            if decided is not None:
                return Verdict.USED if decided else Verdict.DECLINED
            if outer_step < self._floor:
                return Verdict.UNKNOWN
            self._kept_ours.add((asker, outer_step))
            self._bound()
            self._changed.notify_all()
            return Verdict.PENDING

    def wait(self, timeout_s: float) -> None:
        """Until something is decided or acknowledged, a waiter is woken, or timeout_s."""
        with self._changed:
            self._changed.wait(timeout_s)

    def wake(self) -> None:
        """Let a waiter re-check what it waits on now (a push of ours settled)."""
        with self._changed:
            self._changed.notify_all()

    def round_over(self, outer_step: int) -> None:
        """Every decision of `outer_step` and before is recorded: forget the old ones."""
        with self._changed:
            self._floor = max(self._floor, outer_step + 1)
            oldest = self._floor - KEEP_STEPS
            self._decided = {k: v for k, v in self._decided.items() if k[1] >= oldest}
            self._told = {k: v for k, v in self._told.items() if k[1] >= oldest}
            self._kept_ours = {k for k in self._kept_ours if k[1] >= self._floor}

    def _bound(self) -> None:
        """Only partners' messages can grow the record beyond a few per step (our own
        decisions are one per partner and round): the oldest steps' go first (lock held)."""
        while len(self._kept_ours) > MAX_RECORDS:
            self._kept_ours.discard(min(self._kept_ours, key=lambda k: k[1]))
        while len(self._told) > MAX_RECORDS:
            del self._told[min(self._told, key=lambda k: k[1])]
