"""A worker's running counts: what its summary line reports and its heartbeat publishes."""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from noloco_rt.membership.progress import OUTER_STEP_KINDS, WorkerProgress, outer_kind_fields

if TYPE_CHECKING:
    from workers.metrics import WorkerMetrics

TOKEN_WINDOW = 64
"""Recent token counts the throughput is measured over."""


@dataclass
class Counters:
    inner_steps: int = 0
    outer_steps: int = 0
    skipped_steps: int = 0
    """Inner steps our clock skipped when a partner's push pulled us to its outer step before
    our own count reached it (noloco_rt/outer/schedule.py): a slower worker keeps the stage's
    outer clock instead of falling behind it."""
    pulled_outer_steps: int = 0
    """Outer steps taken early because a partner's push for them had arrived."""
    skipped_outer_steps: int = 0
    """Outer steps never taken: a pull to a later one jumped over them (a worker that was
    more than one step behind)."""
    outer_kinds: collections.Counter = field(default_factory=collections.Counter)
    """Outer steps taken by this incarnation, by kind (OUTER_STEP_KINDS)."""
    unmatched_reasons: collections.Counter = field(default_factory=collections.Counter)
    """Why outer steps were not matched (workers.outer.step.unmatched_reason), by reason."""
    microbatches: int = 0
    """Microbatches whose backward this worker completed."""
    sent: int = 0
    """Microbatches this worker originated (first attempts only; retries are counted in `retried`)."""
    retried: int = 0
    answered_late: int = 0
    """Microbatches resolved by the reply of an attempt already given up on (re-sent or waited on)."""
    dropped: int = 0
    outer_blocked_s: float = 0.0
    """Seconds the training thread spent in outer steps (waiting for partners when blocking)."""
    routed_to: collections.Counter = field(default_factory=collections.Counter)
    """Successful sends by peer (short id)."""
    route_passed_over: int = 0
    """Balanced routing: microbatches whose dealt next-stage worker was slow, sent by p2c instead."""

    @property
    def clock_steps(self) -> int:
        """Stage 0's clock: our inner steps plus those skipped by pulls. What run.steps counts,
        what forwards carry as their origin step, and what outer steps follow."""
        return self.inner_steps + self.skipped_steps

    def set_steps(self, inner_steps: int, outer_steps: int, *, h: int, clock_steps: int | None = None) -> None:
        """Counts restored (a checkpoint, a donor's state): the clock saved with them, else one
        at least at the outer step reached, so that a worker that had been pulled ahead of its
        own count stays there."""
        self.inner_steps = inner_steps
        self.outer_steps = outer_steps
        floor = outer_steps * h if clock_steps is None else clock_steps
        self.skipped_steps = max(0, floor - inner_steps)

    def pull_clock_to(self, outer_step: int, *, h: int, clock: bool = True) -> int:
        """A partner's push pulled us to `outer_step` early: our clock jumps to its start, so
        the next outer step is due H inner steps from now (`clock` False: a later stage, whose
        clock is its data, only counts the pull). Returns the inner steps skipped."""
        skipped = max(0, outer_step * h - self.clock_steps) if clock else 0
        self.skipped_steps += skipped
        self.skipped_outer_steps += max(0, outer_step - self.outer_steps - 1)
        self.pulled_outer_steps += 1
        return skipped

    def count_outer_step(self, kind: str, reason: str | None) -> None:
        if kind not in OUTER_STEP_KINDS:
            raise ValueError(f"unknown outer step kind {kind!r}; one of {', '.join(OUTER_STEP_KINDS)}")
        self.outer_kinds[kind] += 1
        if reason is not None:
            self.unmatched_reasons[reason] += 1

    def summary(self) -> dict[str, Any]:
        """Every count by name, for the worker_summary log line."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values["routed_to"] = dict(self.routed_to)
        values["outer_kinds"] = {kind: self.outer_kinds[kind] for kind in OUTER_STEP_KINDS}
        values["unmatched_reasons"] = dict(self.unmatched_reasons)
        values["outer_blocked_s"] = round(self.outer_blocked_s, 3)
        return values

    def progress(self, *, queue_depth: int, loss: float | None, tokens_per_s: float,
                 checkpoint_failed: int = 0) -> WorkerProgress:
        """What the heartbeat publishes, from these counts and the live figures given."""
        return WorkerProgress(outer_step=self.outer_steps, queue_depth=queue_depth, inner_step=self.clock_steps,
                              loss=loss, tokens_per_s=round(tokens_per_s, 1), retried=self.retried,
                              dropped=self.dropped, checkpoint_failed=checkpoint_failed,
                              **outer_kind_fields(self.outer_kinds))


class TokenRate:
    """Tokens processed: the Prometheus counter, and a rate over the last TOKEN_WINDOW additions."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self.metrics = metrics
        self._window: collections.deque[tuple[float, int]] = collections.deque()
        self._in_window = 0
        """The counts in the window, kept as it moves (a sum per addition was a cost per microbatch)."""

    def add(self, count: int) -> None:
        self.metrics.tokens.inc(count)
        if len(self._window) == TOKEN_WINDOW:
            self._in_window -= self._window.popleft()[1]
        self._window.append((time.monotonic(), count))
        self._in_window += count
        self.metrics.tokens_per_s.set(self.per_s())

    def per_s(self) -> float:
        """Tokens per second between the window's first addition and its last (the first's own
        count came before that span began)."""
        if len(self._window) < 2:
            return 0.0
        span = self._window[-1][0] - self._window[0][0]
        return (self._in_window - self._window[0][1]) / span if span > 0 else 0.0
