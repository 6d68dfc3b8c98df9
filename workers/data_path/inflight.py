"""Bookkeeping of microbatches a worker has sent downstream and awaits gradients for.

Pure logic: the caller passes the clock. A microbatch is resolved at most once, by the
first reply of any of its attempts: every attempt carries the same activations, so a
reply to one that was given up (its peer was slow, not dead) is as good as the live
one's, and the microbatch need not be lost or trained twice upstream. A reply for a
microbatch already resolved or given up is reported as stale, so the caller drops and
counts it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class InflightEntry:
    microbatch_id: int
    tried: list[str]
    """Worker ids tried so far, oldest first (index = attempt; "" when none was live): a
    retry never goes back to one of them."""
    sent_times: list[float]
    """When each attempt was sent (index = attempt)."""
    deadline_at: float
    payload: Any = None
    """What a re-send needs (the frames sent)."""
    context: Any = None
    """What the gradient is applied to (the local output with its graph)."""
    unsent: set[int] = field(default_factory=set)
    """Attempts that never left (no live peer, or the link reported the send failed)."""
    given_up: int = -1
    """The latest attempt whose peer was given up on (blamed and released once, not at every wait)."""
    waits: int = 0
    """Deadlines passed with no untried peer left, spent waiting on the attempts already out."""
    answered: int | None = None
    """The attempt whose reply resolved the entry (set by resolve)."""

    @property
    def attempt(self) -> int:
        """The current (latest) attempt."""
        return len(self.tried) - 1

    @property
    def peer(self) -> str:
        """Worker id of the peer the current attempt was sent to ("" if none was live)."""
        return self.tried[-1]

    @property
    def sent_at(self) -> float:
        """When the current attempt was sent."""
        return self.sent_times[-1]

    def released(self) -> bool:
        """Whether the current attempt no longer counts toward its peer's load: it never
        left, or it was given up on (we may still be waiting for its reply)."""
        return not self.peer or self.attempt in self.unsent or self.given_up == self.attempt

    def any_out(self) -> bool:
        """Whether some attempt reached a peer, so that a reply may still come."""
        return len(self.unsent) < self.attempt + 1

    def round_trip_s(self, now: float) -> float:
        """Seconds from the answered attempt's send to `now`."""
        return now - self.sent_times[self._answering]

    @property
    def answered_by(self) -> str:
        """The peer whose reply resolved the entry."""
        return self.tried[self._answering]

    @property
    def _answering(self) -> int:
        return self.answered if self.answered is not None else self.attempt


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
        entry = InflightEntry(microbatch_id, [peer], [now], now + deadline_s, payload, context)
        self._entries[microbatch_id] = entry
        return entry

    def get(self, microbatch_id: int) -> InflightEntry | None:
        return self._entries.get(microbatch_id)

    def resolve(self, microbatch_id: int, attempt: int) -> InflightEntry | None:
        """The entry, removed, if the microbatch is in flight and `attempt` is one of its
        attempts (the live one or one given up); else None (a stale or made-up reply)."""
        entry = self._entries.get(microbatch_id)
        if entry is None or not 0 <= attempt <= entry.attempt:
            return None
        del self._entries[microbatch_id]
        entry.answered = attempt
        return entry

    def wait_again(self, microbatch_id: int, *, now: float, deadline_s: float) -> InflightEntry:
        """No untried peer is left: wait on the attempts already out for another deadline."""
        entry = self._entries[microbatch_id]
        entry.waits += 1
        entry.deadline_at = now + deadline_s
        return entry

    def expired(self, now: float) -> list[InflightEntry]:
        return [e for e in self._entries.values() if now >= e.deadline_at]

    def retry(self, microbatch_id: int, *, peer: str, now: float, deadline_s: float) -> InflightEntry:
        """Start a new attempt to `peer`; replies to earlier attempts become stale."""
        entry = self._entries[microbatch_id]
        entry.tried.append(peer)
        entry.sent_times.append(now)
        entry.deadline_at = now + deadline_s
        return entry

    def abandon(self, microbatch_id: int) -> InflightEntry | None:
        return self._entries.pop(microbatch_id, None)
