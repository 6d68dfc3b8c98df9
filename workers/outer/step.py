"""The outer step (DESIGN §1, §4): publish our contribution, get a partner's, apply the formula."""

from __future__ import annotations

from typing import Any

import zmq

from noloco_rt.algo.matching import matched_partners
from noloco_rt.algo.optim import OuterCoefficients
from noloco_rt.algo.replica import StageReplica
from noloco_rt.config import Config
from noloco_rt.membership.peers import PeerView
from noloco_rt.membership.records import MemberRecord
from workers.counters import Counters
from workers.metrics import WorkerMetrics
from workers.outer.exchange import exchange_with_group
from workers.outer.service import SnapshotService


class OuterStep:
    """Every H inner steps: the outer step with our matched group (noloco), else alone."""

    def __init__(self, cfg: Config, *, zmq_ctx: zmq.Context, replica: StageReplica, peers: PeerView,
                 service: SnapshotService, counters: Counters, metrics: WorkerMetrics, log: Any) -> None:
        self.cfg = cfg
        self.settings = cfg.outer.resolved()
        self.coeffs = OuterCoefficients.from_config(self.settings)
        self.zmq_ctx = zmq_ctx
        self.replica = replica
        self.peers = peers
        self.service = service
        self.counters = counters
        self.metrics = metrics
        self.log = log

    def due(self, inner_steps: int) -> bool:
        return inner_steps % self.settings.h == 0

    def take(self) -> None:
        """Publish our contribution for the next outer step, apply the step with our matched
        group's (the partners that answered; alone when none did), then publish the new state
        for joiners."""
        target_step = self.counters.outer_steps + 1
        state = self.replica.outer_state(theta_only=self.coeffs.theta_shortcut)
        self.service.publish_contribution(state, target_step)
        partners = self.partners(target_step) if self.settings.method == "noloco" else []
        states = exchange_with_group(self.zmq_ctx, self.peers, self.service, target_step, partners,
                                     timeout_s=self.cfg.worker.exchange_timeout_s) if partners else []
        self.replica.apply_outer_step(states, self.coeffs)
        self.counters.outer_steps = target_step
        kind = outer_step_kind(len(partners), len(states))
        if states:
            self.counters.peer_exchanges += 1
        else:
            self.counters.local_outer_steps += 1
        self.metrics.outer_steps.labels(kind=kind).inc()
        self.log.info("outer_step_done", outer_step=target_step, kind=kind,
                      group=[p.worker_id[:8] for p in partners], used=len(states))
        self.service.publish_bootstrap(self.replica, self.counters.inner_steps, self.counters.outer_steps)

    def partners(self, outer_step: int) -> list[MemberRecord]:
        """Our group at `outer_step` in the partition of our stage's view (us included)."""
        stage, me = self.service.stage, self.service.worker_id
        view = {r.worker_id: r for r in self.peers.views.view(stage)}
        ids = matched_partners([*view, me], me, seed=self.cfg.run.seed, stage=stage, outer_step=outer_step,
                               group_size=self.settings.group_size)
        return [view[i] for i in ids]


def outer_step_kind(partners: int, used: int) -> str:
    """matched: every computed partner's state was used; partial: some; local: none (or alone)."""
    if partners and used == partners:
        return "matched"
    return "partial" if used else "local"
