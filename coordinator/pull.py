"""Read-only snapshot pulls from workers' exchange sockets, at a bounded rate.

The coordinator asks a worker for the same bootstrap snapshot a joiner downloads
(slow weights, momentum, counters; checksummed, validated, size-bounded), marked as
an observer request. Pulls never go through the training loop of the worker: its
exchange thread answers from the snapshot it already published.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import zmq

from noloco_rt.config import Config
from noloco_rt.consensus.file import stage_parameter_shapes
from noloco_rt.logs import EventLog
from noloco_rt.membership.records import MemberRecord
from noloco_rt.outer.snapshot import SnapshotReader
from noloco_rt.outer.snapshot_client import pull_bootstrap

if TYPE_CHECKING:
    from coordinator.server import CoordinatorMetrics


class RateLimiter:
    """At most `rate_per_s` acquisitions per second, evenly spaced (no bursts)."""

    def __init__(self, rate_per_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if rate_per_s <= 0:
            raise ValueError(f"rate_per_s must be > 0, got {rate_per_s}")
        self.interval_s = 1.0 / rate_per_s
        self.clock = clock
        self._next = clock()

    def delay_s(self) -> float:
        """Seconds until the next acquisition is allowed (0 if now)."""
        return max(0.0, self._next - self.clock())

    def take(self) -> None:
        """Record an acquisition now (the caller waited delay_s first)."""
        self._next = max(self._next, self.clock()) + self.interval_s

    def acquire(self, stop: threading.Event) -> bool:
        """Wait for the next slot; False if `stop` was set meanwhile."""
        if stop.wait(self.delay_s()):
            return False
        self.take()
        return True


@dataclass(frozen=True)
class PulledReplica:
    worker_id: str
    name: str
    stage: int
    slow: list[torch.Tensor]
    inner_steps: int
    outer_steps: int
    checksum: str


class SnapshotPuller:
    """Pulls a stage's slow weights from one worker; validates them like a joiner does."""

    def __init__(self, cfg: Config, ctx: zmq.Context, *, metrics: CoordinatorMetrics, log: EventLog,
                 limiter: RateLimiter) -> None:
        self.cfg = cfg
        self.ctx = ctx
        self.metrics = metrics
        self.log = log
        self.limiter = limiter
        self.sender = f"coordinator-{uuid.uuid4().hex[:12]}"
        self.readers = [SnapshotReader(cfg.run.run_id, [tuple(shape) for _, shape in stage_parameter_shapes(cfg, stage)])
                        for stage in range(cfg.pipeline.stages)]

    def _count_reject(self, reason: str) -> None:
        self.metrics.rejected.labels(reason=reason).inc()

    def pull(self, member: MemberRecord, stop: threading.Event) -> PulledReplica | None:
        """The member's latest slow weights, or None (stopped, timed out or rejected)."""
        if not 0 <= member.stage < len(self.readers) or not self.limiter.acquire(stop):
            return None
        state = pull_bootstrap(self.ctx, member.worker_id, member.exchange_addr, self.readers[member.stage],
                               stage=member.stage, sender=self.sender, timeout_s=self.cfg.coordinator.pull_timeout_s,
                               on_reject=self._count_reject, log=self.log, observer=True)
        if state is None:
            return None
        return PulledReplica(worker_id=member.worker_id, name=member.name, stage=member.stage, slow=state.slow,
                             inner_steps=state.inner_steps, outer_steps=state.outer_steps, checksum=state.checksum)
