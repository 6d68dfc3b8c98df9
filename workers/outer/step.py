"""The outer step (DESIGN §1, §4): publish our contribution, get a partner's, apply the formula."""

from __future__ import annotations

from typing import Any

import zmq

from noloco_rt.algo.optim import OuterCoefficients
from noloco_rt.algo.replica import StageReplica
from noloco_rt.config import Config
from noloco_rt.membership.peers import PeerView
from workers.counters import Counters
from workers.metrics import WorkerMetrics
from workers.outer.exchange import exchange_with_peer
from workers.outer.service import SnapshotService


class OuterStep:
    """Every H inner steps: the group outer step with a partner (noloco), else alone."""

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
        """Publish our contribution for the next outer step, apply the step with the partner's
        (or alone when none answered), then publish the new state for joiners."""
        target_step = self.counters.outer_steps + 1
        state = self.replica.outer_state(theta_only=self.coeffs.theta_shortcut)
        self.service.publish_contribution(state, target_step)
        with_peers = self.settings.method == "noloco"
        peer_state = None
        if with_peers:
            peer_state = exchange_with_peer(self.zmq_ctx, self.peers, self.service.stage, self.service, target_step,
                                            attempts=self.cfg.worker.exchange_attempts,
                                            timeout_s=self.cfg.worker.exchange_timeout_s)
        self.replica.apply_outer_step([peer_state] if peer_state is not None else [], self.coeffs)
        self.counters.outer_steps = target_step
        if peer_state is not None:
            self.counters.peer_exchanges += 1
            self.metrics.outer_steps.labels(kind="peer").inc()
        else:
            self.counters.local_outer_steps += 1
            self.metrics.outer_steps.labels(kind="local").inc()
            if with_peers:
                self.log.warning("outer_step_local", outer_step=target_step, note="no peer answered")
        self.service.publish_bootstrap(self.replica, self.counters.inner_steps, self.counters.outer_steps)
