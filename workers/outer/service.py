"""The server side of the outer exchange: this worker's published snapshots, answered to peers.

Once per outer step the worker publishes an immutable compressed snapshot of what its
peers need (θ, or φ and Δ when γ ≠ β), and after the step its slow weights, momentum and
counters for joiners. The exchange server's thread answers requests from those, so serving
never blocks training. A request carries the requester's own contribution: it is validated
in full on the server thread (a zstd bomb or NaN payload is refused at once with an ERROR)
and kept in the inbox for our next outer step. A requester a little ahead of us gets our
snapshot once we reach its step, or after a short wait what we have.
"""

from __future__ import annotations

import threading
from typing import Any

import zmq

from noloco_rt.algo.optim import PeerOuterState
from noloco_rt.algo.replica import StageReplica
from noloco_rt.config import Config
from noloco_rt.net.snapshot import (
    PartsKind,
    Snapshot,
    SnapshotReader,
    SnapshotRejected,
    contribution_parts,
    encode_snapshot,
    snapshot_message,
)
from noloco_rt.net.wire import Header, MessageKind
from workers.metrics import RejectCounter
from workers.outer.faults import inject_snapshot_faults
from workers.outer.inbox import SnapshotInbox

SERVER_WAIT_FOR_OWN_STEP_S = 2.0


class SnapshotService:
    """Publishes this worker's snapshots (training thread) and answers peers' requests (server thread)."""

    def __init__(self, cfg: Config, stage: int, worker_id: str, *, metrics: Any, log: Any,
                 expected_shapes: list[tuple[int, ...]]) -> None:
        self.cfg = cfg
        self.stage = stage
        self.worker_id = worker_id
        self.metrics = metrics
        self.log = log
        self.reader = SnapshotReader(cfg.run.run_id, expected_shapes)
        self.inbox = SnapshotInbox(fresh_s=2 * cfg.worker.exchange_timeout_s)
        self.rejected = RejectCounter(metrics.rejected)
        self._contribution: Snapshot | None = None
        self._bootstrap: Snapshot | None = None
        self._own_state: PeerOuterState | None = None
        self._published = threading.Condition()

    def count_reject(self, reason: Any) -> None:
        self.rejected.count(reason)

    @property
    def rejects(self) -> dict[str, int]:
        """Exchange-side rejects so far, by reason."""
        return self.rejected.counts()

    # -- publishing (training thread) ---------------------------------------------------

    def publish_contribution(self, state: PeerOuterState, outer_step: int) -> Snapshot:
        parts, parts_kind = contribution_parts(state)
        snapshot = encode_snapshot(inject_snapshot_faults(parts, self.cfg), self.cfg.worker.snapshot_codec,
                                   outer_step, parts_kind)
        with self._published:
            self._own_state = state  # the honest state: what peers' contributions are compared with
            self._contribution = snapshot
            self._published.notify_all()
        return snapshot

    @property
    def contribution(self) -> Snapshot | None:
        """The latest published outer-step snapshot."""
        return self._contribution

    @property
    def own_state(self) -> PeerOuterState | None:
        """The (unfaulted) state behind the latest published contribution."""
        return self._own_state

    def publish_bootstrap(self, replica: StageReplica, inner_steps: int, outer_steps: int) -> None:
        # Lossless codec: a joiner must start from exactly the donor's slow weights.
        codec = self.cfg.worker.snapshot_codec
        lossless = "shuffle-zstd" if "bf16" in codec else codec
        self._bootstrap = encode_snapshot(replica.slow + replica.momentum, lossless, outer_steps,
                                          PartsKind.SLOW_MOMENTUM,
                                          {"inner_steps": inner_steps, "outer_steps": outer_steps})

    def take_inbox(self, outer_step: int, sender: str | None = None) -> tuple[str, Snapshot, PeerOuterState] | None:
        """A validated snapshot a peer (`sender`, or anyone) sent us for exactly this outer step
        (recently), if any."""
        return self.inbox.take(outer_step, sender)

    # -- serving (server thread) --------------------------------------------------------

    def _message(self, kind: MessageKind, snapshot: Snapshot | None = None) -> list[Any]:
        return snapshot_message(kind, run_id=self.cfg.run.run_id, stage=self.stage, sender=self.worker_id,
                                snapshot=snapshot)

    def handle(self, frames: list[zmq.Frame]) -> list[Any]:
        """The reply to one request: a snapshot, or an ERROR for anything refused (and counted)."""
        try:
            decoded = self.reader.message(frames)
            header = decoded.header
            if header.stage != self.stage:
                raise SnapshotRejected("wrong_stage")
            kind = MessageKind(header.kind)
            if kind == MessageKind.BOOTSTRAP_REQUEST:
                return self._serve_bootstrap(header)
            if kind != MessageKind.SNAPSHOT_REQUEST:
                raise SnapshotRejected("unexpected_kind")
            theirs, their_state = self.reader.contribution(decoded)
        except SnapshotRejected as rejected:
            self.count_reject(rejected.reason)
            return self._message(MessageKind.ERROR)
        self.inbox.keep(header.sender, theirs, their_state)
        return self._message(MessageKind.SNAPSHOT_REPLY, self._own_contribution_for(header.outer_step))

    def _serve_bootstrap(self, header: Header) -> list[Any]:
        snapshot = self._bootstrap
        # The coordinator pulls the same snapshot read-only, often: not worth a log line.
        if snapshot is not None and not header.extra.get("observer"):
            self.log.info("bootstrap_served", to=header.sender[:8], checksum=snapshot.digest,
                          outer_step=snapshot.outer_step)
        return self._message(MessageKind.BOOTSTRAP_REPLY, snapshot)

    def _own_contribution_for(self, outer_step: int) -> Snapshot | None:
        """Our snapshot once we reach `outer_step` (a requester a little ahead of us), or after a
        short wait what we have."""
        with self._published:
            self._published.wait_for(lambda: self._contribution is not None
                                     and self._contribution.outer_step >= outer_step,
                                     timeout=SERVER_WAIT_FOR_OWN_STEP_S)
            return self._contribution
