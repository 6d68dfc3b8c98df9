"""Snapshots partners pushed to us, kept for the outer step of ours they are for.

A partner pushes as soon as it reaches its outer step, which may be before or after we
reach ours, so the inbox keys entries by (sender, our outer step) and keeps those of
steps we have not passed yet (seeded groups pair equal steps; a partner found by
readiness may be at another step of its own). Bounded: only a few are ever useful (one per partner and
pending step), and a flood of pushes from made-up senders must not grow memory. A full
inbox refuses, never drops what it acknowledged: the sender of an acknowledged push may
use ours, so ours must be able to use its.
The exchanger thread waits on it for the pushes of its round's partners.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import NamedTuple

from noloco_rt.outer.formula import PeerOuterState
from noloco_rt.outer.snapshot import Snapshot

MAX_INBOX = 8



class KeptPush(NamedTuple):
    """A partner's whole contribution as kept."""

    snapshot: Snapshot
    state: PeerOuterState
    group_size: int | None = None
    """The group as the partner computed it (None: it did not say)."""


Entry = tuple[float, KeptPush]


class SnapshotInbox:
    """Validated contributions by (sender, outer step), at most `max_size`, fresh for `fresh_s`."""

    def __init__(self, *, fresh_s: float, max_size: int = MAX_INBOX,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.fresh_s = fresh_s
        self.max_size = max_size
        self.clock = clock
        self.floor = 0
        """Pushes for outer steps below this are of no use any more (set as rounds end)."""
        self.closed_through = 0
        """Pushes for outer steps up to this one are refused (rounds given up as late), though
        the ones kept before stay until their round takes them."""
        self._entries: dict[tuple[str, int], Entry] = {}
        self._refused: set[tuple[str, int]] = set()
        """(sender, step) whose push a round decided without: refused if it comes now."""
        self._taken: set[tuple[str, int]] = set()
        """(sender, step) whose kept push its round took: acknowledged, so as committed as a kept one."""
        self._arrived = threading.Condition()

    def __len__(self) -> int:
        return len(self._entries)

    def _evict(self) -> None:
        now = self.clock()
        for key, (received_at, _) in list(self._entries.items()):
            if key[1] < self.floor or now - received_at >= self.fresh_s:
                del self._entries[key]

    def keep(self, sender: str, for_step: int, snapshot: Snapshot, state: PeerOuterState, *,
             group_size: int | None = None) -> bool:
        """Remember a sender's contribution for our outer step `for_step`, evicting stale
        entries and those of steps behind us; False (not kept, so not acknowledged) when
        that step is behind us or refused, or when the inbox is still full. A kept
        contribution leaves only when taken, when its step is behind us, or when stale."""
        with self._arrived:
            if not self.accepts(for_step, sender):
                return False
            self._evict()
            key = (sender, for_step)
            self._entries.pop(key, None)
            if len(self._entries) >= self.max_size:
                # Full: refuse this one rather than drop one we acknowledged (its sender would
                # use ours while we, without its, would not: one-sided).
                return False
            self._entries[key] = (self.clock(), KeptPush(snapshot, state, group_size))
            self._arrived.notify_all()
            return True

    def latest_pushes(self, outer_step: int) -> dict[int, set[str]]:
        """Each sender's latest fresh push kept for our outer steps from `outer_step` on, by
        step (nothing is taken). Only the latest counts: a sender that pushed for a later
        step has closed its round for the earlier one."""
        with self._arrived:
            now = self.clock()
            latest: dict[str, int] = {}
            for (sender, step), (received_at, _) in self._entries.items():
                if step >= outer_step and now - received_at < self.fresh_s:
                    latest[sender] = max(step, latest.get(sender, step))
            pushed: dict[int, set[str]] = {}
            for sender, step in latest.items():
                pushed.setdefault(step, set()).add(sender)
            return pushed

    def accepts(self, for_step: int, sender: str | None = None) -> bool:
        """Whether a push for our outer step `for_step` (from `sender`) may still be kept."""
        return (for_step >= self.floor and for_step > self.closed_through
                and (sender, for_step) not in self._refused)

    def here_or_refused(self, outer_step: int, sender: str) -> bool:
        """Whether `sender`'s push for `outer_step` is here; if not, it is refused from now
        on, atomically: a round that decides without it must not acknowledge it a moment
        later (its sender would use ours while we do not use its)."""
        with self._arrived:
            if (sender, outer_step) in self._entries:
                return True
            self._refused.add((sender, outer_step))
            return False

    def close(self, outer_step: int) -> set[str]:
        """Refuse every later push for `outer_step` and earlier (its round is given up as late);
        the senders whose pushes for it were already kept (and acknowledged): those still here
        and those its round took already (it may be computing the correction with them)."""
        with self._arrived:
            self.closed_through = max(self.closed_through, outer_step)
            return {sender for sender, step in (*self._entries, *self._taken) if step == outer_step}

    def take(self, outer_step: int, sender: str) -> KeptPush | None:
        """`sender`'s fresh contribution for exactly this outer step, removed; None if none."""
        with self._arrived:
            entry = self._entries.pop((sender, outer_step), None)
            if entry is None or self.clock() - entry[0] >= self.fresh_s:
                return None
            self._taken.add((sender, outer_step))
            return entry[1]

    def wait_for(self, outer_step: int, senders: Iterable[str], *, timeout_s: float,
                 stop: Callable[[set[str]], bool] = lambda here: False) -> set[str]:
        """Block until every sender's step push is here, `stop(senders here)` says so, or
        timeout_s has passed; returns the senders whose push is here."""
        wanted = set(senders)
        deadline = time.monotonic() + timeout_s
        with self._arrived:
            while True:
                here = {s for s in wanted if (s, outer_step) in self._entries}
                remaining = deadline - time.monotonic()
                if here == wanted or remaining <= 0 or stop(here):
                    return here
                self._arrived.wait(min(remaining, 0.05))

    def advance(self, floor: int) -> None:
        """Forget pushes for steps below `floor`: our rounds up to there are over."""
        with self._arrived:
            self.floor = max(self.floor, floor)
            self._refused = {key for key in self._refused if key[1] >= self.floor}
            self._taken = {key for key in self._taken if key[1] >= self.floor}
            self._evict()

    def wake(self) -> None:
        """Let a waiter re-check its stop condition now."""
        with self._arrived:
            self._arrived.notify_all()

    def clear(self) -> None:
        with self._arrived:
            self._entries.clear()
            self._taken.clear()
