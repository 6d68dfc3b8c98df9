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

from noloco_rt.logs import EventLog
from noloco_rt.membership.records import WorkerState
from noloco_rt.membership.table import Membership
from workers.counters import Counters

UPSTREAM_CHECK_S = 0.5
UPSTREAM_GONE_S = 5.0
"""worker.upstream_gone_s's default."""


class FinishRule(Protocol):
    def finished(self) -> bool: ...


class StepLimit:
    """The first stage: done when its clock reaches max_steps (its inner steps, plus any its
    partners' pushes made it skip: a slowed worker ends with its stage)."""

    def __init__(self, counters: Counters, max_steps: int) -> None:
        self.counters = counters
        self.max_steps = max_steps

    def finished(self) -> bool:
        return self.counters.clock_steps >= self.max_steps


class UpstreamFinished:
    """A later stage: done when idle and every upstream worker has finished.

    "Every upstream worker has finished": none is live in the table for `gone_s` (a margin
    over a restarting upstream's absence), while Redis answers, and a worker of the
    upstream stage marked it finished since it last had a live worker. An upstream stage that
    vanished without that mark (all its machines reclaimed at once) is waited for, however
    long: its replacements resume from their checkpoints or the durable store and need a
    downstream, and a run never ends on a guess (finishing here would mark it finished short
    of run.steps). Every `lost_s` of that wait is logged (`upstream_lost`), saying what to do
    if the upstream did finish and Redis lost its mark: start one of its workers again, which
    resumes at run.steps, finishes at once and marks the stage.

    A forward from upstream heard within UPSTREAM_CHECK_S shows it live without asking Redis:
    the training thread, idle between microbatches, makes no round trip to Redis while
    forwards flow (one took milliseconds on a loaded machine, and a second or more with Redis
    unreachable)."""

    def __init__(self, membership: Membership, stage: int, *, idle: Callable[[], bool],
                 received_from_upstream: Callable[[], bool], lost_s: float, log: EventLog,
                 gone_s: float = UPSTREAM_GONE_S, clock: Callable[[], float] = time.monotonic,
                 heard_from_upstream_at: Callable[[], float | None] = lambda: None) -> None:
        self.membership = membership
        self.upstream_stage = stage - 1
        self.idle = idle
        self.received_from_upstream = received_from_upstream
        self.heard_from_upstream_at = heard_from_upstream_at
        """When the last forward from upstream arrived, on `clock` (None: none yet)."""
        self.lost_s = lost_s
        self.gone_s = gone_s
        self.log = log
        self.clock = clock
        self._checked_at = float("-inf")
        self._reported_at = float("-inf")
        self._absent_since: float | None = None
        self._seen_live = False
        self._marked = False

    def finished(self) -> bool:
        if not self.idle():
            return False
        now = self.clock()
        heard_at = self.heard_from_upstream_at()
        if heard_at is not None and now - heard_at < UPSTREAM_CHECK_S:
            self._upstream_live()
            return False
        if now - self._checked_at >= UPSTREAM_CHECK_S:
            self._checked_at = now
            self._check_upstream(now)
        if self._absent_since is None:
            return False
        absent_s = now - self._absent_since
        if self._marked:
            return absent_s >= self.gone_s
        if absent_s >= self.lost_s and now - self._reported_at >= self.lost_s \
                and (self._seen_live or self.received_from_upstream()):
            self._reported_at = now
            self.log.warning("upstream_lost", stage=self.upstream_stage, absent_s=round(absent_s, 1),
                             note="no live worker of the upstream stage and no finished mark: waiting for its "
                                  "replacements. If it did finish and Redis lost the mark, start one of its "
                                  "workers again: it resumes at run.steps and marks the stage finished")
        return False

    def _check_upstream(self, now: float) -> None:
        upstream = self.membership.live_members(stage=self.upstream_stage,
                                                states={WorkerState.JOINING, WorkerState.ONLINE})
        if upstream:
            self._upstream_live()
            return
        if self.membership.stage_finished(self.upstream_stage):
            self._marked = True  # kept should Redis lose it
        if not self.membership.redis_available:
            self._absent_since = None
        elif self._absent_since is None:
            self._absent_since = now

    def _upstream_live(self) -> None:
        self._seen_live = True
        self._marked = False  # the stage trains again: an earlier finish no longer speaks for it
        self._absent_since = None
