"""Snapshots peers sent us with their requests, kept for our own outer step.

A worker that finds here a snapshot of a peer for its very outer step uses it instead of
asking someone else, so two workers that chose each other form the symmetric pair of the
paper. Bounded: only a few are ever useful (one per partner), and a flood of requests from
made-up senders must not grow memory.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from noloco_rt.algo.optim import PeerOuterState
from noloco_rt.net.snapshot import Snapshot

MAX_INBOX = 8


class SnapshotInbox:
    """Validated contributions by sender, the newest per sender, at most `max_size`, fresh for `fresh_s`."""

    def __init__(self, *, fresh_s: float, max_size: int = MAX_INBOX,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.fresh_s = fresh_s
        self.max_size = max_size
        self.clock = clock
        self._entries: dict[str, tuple[float, Snapshot, PeerOuterState]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def _fresh(self, received_at: float) -> bool:
        return self.clock() - received_at < self.fresh_s

    def keep(self, sender: str, snapshot: Snapshot, state: PeerOuterState) -> None:
        """Remember a sender's contribution, evicting stale entries, then the oldest."""
        with self._lock:
            for key, (received_at, _, _) in list(self._entries.items()):
                if not self._fresh(received_at):
                    del self._entries[key]
            self._entries.pop(sender, None)
            while len(self._entries) >= self.max_size:  # oldest first (dicts keep insertion order)
                del self._entries[next(iter(self._entries))]
            self._entries[sender] = (self.clock(), snapshot, state)

    def take(self, outer_step: int, sender: str | None = None) -> tuple[str, Snapshot, PeerOuterState] | None:
        """A fresh contribution for exactly this outer step (from `sender`, or anyone), removed
        from the inbox; None if none."""
        with self._lock:
            for from_id, (received_at, snapshot, state) in list(self._entries.items()):
                if sender is not None and from_id != sender:
                    continue
                if snapshot.outer_step == outer_step and self._fresh(received_at):
                    del self._entries[from_id]
                    return from_id, snapshot, state
        return None

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
