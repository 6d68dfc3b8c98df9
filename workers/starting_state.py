"""Where a starting worker's state comes from (docs/architecture.md "Joiners"), in this order:
its own checkpoint, a live peer of its stage, the stage's newest durable checkpoint, the
run's seed where that is allowed. The choice and the loading are here; the donor search is
workers/outer/bootstrap.py."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import zmq

from noloco_rt.algo.replica import StageReplica
from noloco_rt.config import Config
from noloco_rt.config.redaction import redact_url
from noloco_rt.data import DataCursor
from noloco_rt.logs import EventLog
from noloco_rt.membership.table import Membership
from noloco_rt.outer.snapshot_client import BootstrapState
from noloco_rt.routing.peers import PeerView
from noloco_rt.transfer_time import StageTimeouts
from workers.counters import Counters
from workers.durable_state import DurableStageState
from workers.lifecycle import WorkerCheckpoint
from workers.outer.bootstrap import (
    MarkAsSeen,
    NoDonorServed,
    StageProgressLost,
    bootstrap_from_stage,
    check_may_seed,
    link_probe,
)
from workers.outer.service import SnapshotService


@dataclass
class StartingState:
    """A worker's parts that its starting state is read from or loaded into."""

    cfg: Config
    stage: int
    worker_id: str
    h: int
    """The outer step's period: a donor's inner steps set our outer-step count."""
    ctx: zmq.Context
    membership: Membership
    peers: PeerView
    snapshots: SnapshotService
    timeouts: StageTimeouts
    replica: StageReplica
    counters: Counters
    checkpoint: WorkerCheckpoint
    durable: DurableStageState | None
    leave_requested: threading.Event
    log: EventLog
    mark: MarkAsSeen = field(init=False)
    """The stage's high-water mark as our bootstrap read it (for the seed check)."""

    def __post_init__(self) -> None:
        self.mark = MarkAsSeen(lambda: self.membership.high_water.of(self.stage))

    def resume_or_bootstrap(self) -> DataCursor | None:
        """Our checkpoint if there is one (returns its data cursor), else a live peer's state,
        else the stage's newest durable checkpoint, else the seed where that is allowed."""
        resumed, cursor = self.checkpoint.resume()
        if resumed:
            return cursor
        try:
            donated = self._from_a_peer()
            if donated is None and (settling_s := self.membership.settling_s()) > 0:
                # Redis restarted moments ago (its data lost): a live peer may not have re-registered
                # yet, and taking the seed would throw the stage's training away for this replica.
                self.log.warning("membership_settling", wait_s=round(settling_s, 1),
                                 note="Redis started moments ago: waiting for live peers to re-register")
                self.leave_requested.wait(settling_s)
                donated = self._from_a_peer()
        except NoDonorServed as exc:
            return self._without_a_donor(exc)
        if donated is not None:
            self._load_donated(*donated)
        elif not self._resume_from_store():
            check_may_seed(self.stage, self.mark.for_seed_check(),
                           allow_reseed=self.cfg.worker.allow_reseed, store_url=redact_url(self.cfg.store.url))
            self.log.info("first_of_stage", note="initialised from the run seed (or --init-from)")
        return self.durable.cursor() if self.durable is not None else None

    def _from_a_peer(self) -> tuple[str, BootstrapState] | None:
        return bootstrap_from_stage(self.ctx, self.peers, self.snapshots, timeout_s=self.timeouts.bootstrap_s,
                                    pull_timeout_s=self.timeouts.bootstrap_pull_s,
                                    leave_requested=self.leave_requested, site=self.cfg.worker.site,
                                    stage_high_water=self.mark,
                                    probe=link_probe(self.ctx, self.membership, self.cfg, worker_id=self.worker_id,
                                                     stage=self.stage))

    def _load_donated(self, donor: str, state: BootstrapState) -> None:
        """A donor's φ as our slow and fast weights, its momentum and its step counts."""
        self.replica.load_weights(slow=state.slow, fast=state.slow, momentum=state.momentum)
        self.replica.inner.steps_taken = state.inner_steps
        self.counters.set_steps(state.inner_steps, state.outer_steps, h=self.h)
        self.log.info("bootstrapped", donor=donor[:8], checksum=state.checksum,
                      inner_step=self.counters.inner_steps, outer_step=self.counters.outer_steps)

    def _without_a_donor(self, exc: NoDonorServed) -> DataCursor | None:
        """Listed peers served nothing: the durable store's checkpoint, else exit 3 (try again
        later) rather than a crash, and never the seed (the stage is evidently past it)."""
        if self.leave_requested.is_set():
            raise exc  # told to leave while waiting for a donor: nothing to resume for
        self.log.warning("bootstrap_unserved", error=str(exc),
                         note="members of this stage are listed but none served its state")
        if self._resume_from_store():
            return self.durable.cursor() if self.durable is not None else None
        raise StageProgressLost(f"{exc}, and there is no durable checkpoint of stage {self.stage} to resume: the "
                                f"listed members may be gone or not real workers; try again later")

    def _resume_from_store(self) -> bool:
        """No live peer: continue the stage from its newest checkpoint in the durable store."""
        loaded = self.durable.latest() if self.durable is not None else None
        if loaded is None:
            return False
        self.checkpoint.apply(loaded.state)
        info = loaded.info
        self.log.warning("resumed_from_store", outer_step=info.outer_step, inner_step=info.inner_step,
                         clock_step=self.counters.clock_steps, sha256=info.sha256[:16], writer=info.writer,
                         run_reached=self.membership.high_water.of(self.stage),
                         note="no live peer of this stage: continuing from its durable checkpoint")
        return True
