"""When a worker's training is done (the rule differs by stage; the data path picks one).

run.steps counts the first stage's inner steps (the data consumed). A later stage is
done when every upstream worker has finished and nothing of its own is in flight,
whatever its own step count: routing shares microbatches unequally between the workers
of a stage, so counting our own steps could wait for forwards that never come.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from noloco_rt.membership.records import WorkerState
from noloco_rt.membership.table import Membership
from workers.counters import Counters

UPSTREAM_CHECK_S = 0.5
UPSTREAM_GONE_S = 5.0


class FinishRule(Protocol):
    def finished(self) -> bool: ...


class StepLimit:
    """The first stage: done after max_steps inner steps."""

    def __init__(self, counters: Counters, max_steps: int) -> None:
        self.counters = counters
        self.max_steps = max_steps

    def finished(self) -> bool:
        return self.counters.inner_steps >= self.max_steps


class UpstreamFinished:
    """A later stage: done when idle and every upstream worker has finished.

    "Every upstream worker has finished": none is live in the table for UPSTREAM_GONE_S
    (a margin over a restarting upstream's absence), while Redis answers, and we either
    saw one (live in the table, or by its forwards) or one marked its stage finished (we
    restarted after they left)."""

    def __init__(self, membership: Membership, stage: int, *, idle: Callable[[], bool],
                 received_from_upstream: Callable[[], bool], clock: Callable[[], float] = time.monotonic) -> None:
        self.membership = membership
        self.upstream_stage = stage - 1
        self.idle = idle
        self.received_from_upstream = received_from_upstream
        self.clock = clock
        self._checked_at = float("-inf")
        self._gone_since: float | None = None
        self._seen_live = False

    def finished(self) -> bool:
        if not self.idle():
            return False
        now = self.clock()
        if now - self._checked_at >= UPSTREAM_CHECK_S:
            self._checked_at = now
            self._check_upstream(now)
        return self._gone_since is not None and now - self._gone_since >= UPSTREAM_GONE_S

    def _check_upstream(self, now: float) -> None:
        upstream = self.membership.live_members(stage=self.upstream_stage,
                                                states={WorkerState.JOINING, WorkerState.ONLINE})
        self._seen_live = self._seen_live or bool(upstream)
        seen = self._seen_live or self.received_from_upstream()
        gone = (not upstream and self.membership.redis_available
                and (seen or self.membership.stage_finished(self.upstream_stage)))
        if not gone:
            self._gone_since = None
        elif self._gone_since is None:
            self._gone_since = now
