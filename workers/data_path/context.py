"""What every part of the data path shares: the replica, the sockets, the peers, the counts."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from noloco_rt.algo.replica import StageReplica
from noloco_rt.config import Config
from noloco_rt.membership.peers import PeerView
from noloco_rt.net.transport import DataSocket
from workers.counters import Counters, TokenRate
from workers.device import HostStaging
from workers.metrics import RejectCounter, WorkerMetrics


@dataclass
class DataContext:
    """The live objects a data path works with, and the verbs that count what it does."""

    cfg: Config
    stage: int
    worker_id: str
    replica: StageReplica
    staging: HostStaging
    data: DataSocket
    peers: PeerView
    counters: Counters
    metrics: WorkerMetrics
    log: Any
    leave_requested: threading.Event
    tokens: TokenRate = field(init=False)
    rejected: RejectCounter = field(init=False)
    """Data-path rejects (the exchange counts its own)."""

    def __post_init__(self) -> None:
        self.tokens = TokenRate(self.metrics)
        self.rejected = RejectCounter(self.metrics.rejected)

    @property
    def budget(self) -> int:
        """Microbatches per inner step (B): forwards accepted, or originated by the first stage."""
        return self.cfg.pipeline.max_inflight

    def drop(self, microbatch_id: int, reason: str) -> None:
        """A microbatch is lost: counted, with its reason, and logged."""
        self.counters.dropped += 1
        self.metrics.dropped.labels(reason=reason).inc()
        self.log.warning("microbatch_dropped", microbatch=microbatch_id, reason=reason)

    def discard(self, reason: str) -> None:
        """A duplicate or late reply is ignored: counted by reason, no microbatch is lost."""
        self.metrics.dropped.labels(reason=reason).inc()
