"""Bookkeeping of microbatches a worker has sent downstream and awaits gradients for.

Pure logic: the caller passes the clock. Every (microbatch id, attempt) is resolved
at most once; a reply for an attempt that was superseded or already resolved is
reported as stale so the caller drops and counts it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class InflightEntry:
    microbatch_id: int
    attempt: int
    peer: str
    """Worker id of the peer the current attempt was sent to ("" if none was live)."""
    sent_at: float
    deadline_at: float
    payload: Any = None
    """What a re-send needs (the frames sent)."""
    context: Any = None
    """What the gradient is applied to (the local output with its graph)."""
    tried: list[str] = field(default_factory=list)
    """Worker ids tried so far, oldest first: a retry never goes back to one of them."""


class InflightTable:
    def __init__(self) -> None:
        self._entries: dict[int, InflightEntry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, microbatch_id: int) -> bool:
        return microbatch_id in self._entries

    def add(self, microbatch_id: int, *, peer: str, now: float, deadline_s: float, payload: Any = None,
            context: Any = None) -> InflightEntry:
        if microbatch_id in self._entries:
            raise ValueError(f"microbatch {microbatch_id} is already in flight")
        entry = InflightEntry(microbatch_id, 0, peer, now, now + deadline_s, payload, context, [peer])
        self._entries[microbatch_id] = entry
        return entry

    def get(self, microbatch_id: int) -> InflightEntry | None:
        return self._entries.get(microbatch_id)

    def resolve(self, microbatch_id: int, attempt: int) -> InflightEntry | None:
        """The entry if (microbatch_id, attempt) is the live attempt, removing it; else None."""
        entry = self._entries.get(microbatch_id)
        if entry is None or entry.attempt != attempt:
            return None
        del self._entries[microbatch_id]
        return entry

    def expired(self, now: float) -> list[InflightEntry]:
        return [e for e in self._entries.values() if now >= e.deadline_at]

    def retry(self, microbatch_id: int, *, peer: str, now: float, deadline_s: float) -> InflightEntry:
        """Start a new attempt to `peer`; replies to earlier attempts become stale."""
        entry = self._entries[microbatch_id]
        entry.attempt += 1
        entry.peer = peer
        entry.sent_at = now
        entry.deadline_at = now + deadline_s
        entry.tried.append(peer)
        return entry

    def abandon(self, microbatch_id: int) -> InflightEntry | None:
        return self._entries.pop(microbatch_id, None)
