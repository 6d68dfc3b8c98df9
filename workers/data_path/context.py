"""What every part of the data path shares: the replica, the sockets, the peers, the counts."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

from noloco_rt.algo.replica import StageReplica
from noloco_rt.config import Config
from noloco_rt.logs import EventLog
from noloco_rt.model.staged import StagedModel
from noloco_rt.net import wire_dtype
from noloco_rt.net.data_link import DataLink
from noloco_rt.routing.peers import PeerView
from workers.counters import Counters, TokenRate
from workers.device import HostCopy, HostStaging, autocast_dtype
from workers.metrics import RejectCounter, WorkerMetrics


@dataclass
class DataContext:
    """The live objects a data path works with, and the verbs that count what it does."""

    cfg: Config
    stage: int
    worker_id: str
    model: StagedModel
    """The run's model: its loss, its data, the shapes its stages take."""
    replica: StageReplica
    staging: HostStaging
    data: DataLink
    peers: PeerView
    counters: Counters
    metrics: WorkerMetrics
    log: EventLog
    leave_requested: threading.Event
    graph_outputs: bool = False
    """model.cuda_graphs on CUDA: a stage's output or input gradient may be a CUDA graph's
    output, whose memory the graph's next replay overwrites, so the wire reads a copy."""
    tokens: TokenRate = field(init=False)
    rejected: RejectCounter = field(init=False)
    """Data-path rejects (the exchange counts its own)."""
    autocast: torch.dtype | None = field(init=False)
    """The forward's autocast dtype (None: float32)."""

    def __post_init__(self) -> None:
        self.tokens = TokenRate(self.metrics)
        self.rejected = RejectCounter(self.metrics.rejected)
        self.autocast = autocast_dtype(self.cfg.model.precision, self.staging.device)

    def to_wire(self, tensor: torch.Tensor, *, gradient: bool = False) -> HostCopy:
        """Host frames of an activation (or a gradient) packed in pipeline.wire_dtype: packed on
        the device first, so fewer bytes cross to the host too (on CUDA the copy may still be
        running: the sending thread waits for it)."""
        pipeline = self.cfg.pipeline
        wire = (wire_dtype.gradient_wire_dtype(pipeline.wire_dtype, pipeline.gradient_wire_dtype) if gradient
                else pipeline.wire_dtype)
        return self.staging.to_host(wire_dtype.pack(tensor, wire), graph_outputs=self.graph_outputs)

    def run_stage(self, inputs: torch.Tensor) -> torch.Tensor:
        """The stage's forward (with its graph), under autocast when model.precision asks for
        it: its matmuls run in bfloat16, the weights and their gradients stay float32."""
        if self.autocast is None:
            return self.replica.module(inputs)
        with torch.autocast(device_type=self.staging.device.type, dtype=self.autocast):
            return self.replica.module(inputs)

    @property
    def budget(self) -> int:
        """Microbatches per inner step (B): forwards accepted, or originated by the first stage
        (the worker resolved pipeline.max_inflight = 0 for its memory; the default otherwise)."""
        return self.cfg.pipeline.microbatches_per_step

    def drop(self, microbatch_id: int, reason: str) -> None:
        """A microbatch is lost: counted, with its reason, and logged."""
        self.counters.dropped += 1
        self.metrics.dropped.labels(reason=reason).inc()
        self.log.warning("microbatch_dropped", microbatch=microbatch_id, reason=reason)

    def discard(self, reason: str) -> None:
        """A duplicate or late reply is ignored: counted by reason, no microbatch is lost."""
        self.metrics.dropped.labels(reason=reason).inc()
