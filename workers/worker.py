"""`noloco-rt worker --stage K`: one replica of one pipeline stage, composed from parts.

- data path (workers/data_path/): the training thread's microbatches; its role (alone,
  first, middle or last stage) is decided once, in `data_path_for`;
- inner and outer steps (workers/inner_step.py, workers/outer/step.py): the optimizer
  step once the step's forwards are back, every H inner steps the outer exchange;
- snapshot service (workers/outer/service.py): answers peers from a background thread;
- starting state (workers/starting_state.py): our checkpoint, a live peer's state, the
  stage's durable checkpoint or the seed;
- lifecycle (here, with workers/lifecycle.py): start, the finishing rule (workers/finish.py),
  leave, checkpoints. A heartbeat thread publishes progress.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import zmq

from noloco_rt.algo.replica import StageReplica
from noloco_rt.config import Config
from noloco_rt.logs import get_logger
from noloco_rt.membership.heartbeat import HeartbeatThread
from noloco_rt.membership.pairing import PairingQueue
from noloco_rt.membership.progress import WorkerProgress
from noloco_rt.membership.records import MemberRecord, WorkerState
from noloco_rt.membership.redis_wait import wait_for_redis
from noloco_rt.membership.refresher import ViewRefresher
from noloco_rt.membership.table import Membership
from noloco_rt.memory.fit import MemoryChoice, resolved_config
from noloco_rt.model.init_weights import initial_replica
from noloco_rt.model.staged import staged_model
from noloco_rt.net.data_link import DataLink
from noloco_rt.net.frame_limits import data_frame_limit_bytes, exchange_frame_limit_bytes
from noloco_rt.net.transport import DataSocket, ExchangeServer
from noloco_rt.process.thread_names import name_kernel_threads
from noloco_rt.routing.peers import PeerView
from noloco_rt.transfer_time import stage_timeouts
from workers.checkpoint_writes import CheckpointWrites, checkpoint_due
from workers.compiled_stage import compile_for_device
from workers.counters import Counters
from workers.data_path.context import DataContext
from workers.data_path.receiver import decoder
from workers.data_path.roles import data_path_for
from workers.device import HostStaging, memory_choice, pick_device
from workers.durable_state import durable_state_for
from workers.faults.data_path import DataFaults
from workers.faults.snapshot import snapshot_faults_on
from workers.inner_step import InnerStep
from workers.lifecycle import AliveFile, WorkerCheckpoint
from workers.methods import worker_outer_error
from workers.metrics import WorkerMetrics, merged_counts
from workers.outer.device_boundary import ExchangeBoundary, quantizes_on_device
from workers.outer.exchanger import OuterExchanger
from workers.outer.partners import ReadinessPairing
from workers.outer.service import SnapshotService
from workers.outer.step import OuterStep
from workers.run_finished import mark_run_finished
from workers.starting_state import StartingState

__all__ = ["StageWorker", "default_worker_name", "install_signal_handlers", "pick_device"]

LINK_FLUSH_S = 2.0
"""On close, how long the data link may go on sending what it accepted (gradient replies of a leaving worker)."""


class StageWorker:
    def __init__(self, cfg: Config, stage: int, *, membership: Membership, ctx: zmq.Context,
                 name: str, device: torch.device, checkpoint_path: Path, metrics: WorkerMetrics,
                 max_steps: int | None = None, data_faults: DataFaults | None = None,
                 checkpoint_fault: Callable[[], None] | None = None) -> None:
        if (why := worker_outer_error(cfg.outer)) is not None:
            raise ValueError(why)
        if not 0 <= stage < cfg.pipeline.stages:
            raise ValueError(f"--stage must be in [0, {cfg.pipeline.stages}), got {stage}")
        self.model = staged_model(cfg)  # the preset, or model.factory's own model: loaded once
        memory = memory_choice(cfg, device)
        cfg = resolved_config(cfg, memory)  # every reader sees the in-flight count and checkpointing used
        self.cfg, self.stage, self.name, self.device = cfg, stage, name, device
        self.membership, self.ctx, self.metrics = membership, ctx, metrics
        # A fresh id per incarnation: a quick restart must not be mistaken for the process it replaces.
        self.worker_id = uuid.uuid4().hex
        self.log = get_logger(run=cfg.run.run_id, worker=self.worker_id[:8], stage=stage, name=name)
        self.metrics_addr = ""
        """host:port of the Prometheus endpoint, published in the membership record."""
        self.leave_requested = threading.Event()
        self.heartbeat: HeartbeatThread | None = None
        self.counters = Counters()
        self.replica = self._stage_replica(memory)
        self.cuda_graphs = compile_for_device(self.replica, cfg.model, device, self.log)
        """model.cuda_graphs in effect: compiled on CUDA, replayed as CUDA graphs."""
        self.views = ViewRefresher(membership, {stage, min(stage + 1, cfg.pipeline.stages - 1)},
                                   interval_s=cfg.worker.view_refresh_s, run_stages=cfg.pipeline.stages)
        self.peers = PeerView(self.views, own_id=self.worker_id, backoff_max_s=cfg.worker.peer_backoff_max_s)
        staging = HostStaging(device)
        self.data_faults = data_faults
        """Chaos testing only: data-path messages this worker loses or delays on purpose."""
        self._open_data_path(staging, max_steps if max_steps is not None else cfg.run.steps)
        self._open_exchange(staging)
        # checkpoint_fault: tests only, a disk that fills up (workers/faults/checkpoint_writes.py).
        writes = CheckpointWrites(checkpoint_path, keep=cfg.worker.checkpoint_keep, log=self.log,
                                  failures_metric=metrics.checkpoint_failures, fault=checkpoint_fault,
                                  staging=staging)
        self.checkpoint = WorkerCheckpoint(checkpoint_path, run_id=cfg.run.run_id, stage=stage, name=name,
                                           replica=self.replica, counters=self.counters,
                                           cursor_state=self.data_path.cursor_state, h=self.outer.settings.h,
                                           log=self.log, writes=writes)
        self.alive = AliveFile(cfg.worker.alive_file)
        self.durable = durable_state_for(cfg, stage, worker_id=self.worker_id, name=name, log=self.log,
                                         membership=membership, staging=staging)
        self.inner = InnerStep(data_path=self.data_path, replica=self.replica, outer=self.outer,
                               counters=self.counters, tokens=self.data_path.ctx.tokens, metrics=metrics,
                               log=self.log, slowdown=cfg.worker.fault_slowdown,
                               count_host_reads=cfg.worker.count_host_reads)
        self.outer.on_final = self._periodic_checkpoint

    def _open_data_path(self, staging: HostStaging, steps: int) -> None:
        """The data socket and the stage's data path (forwards in, gradients back), and when it is done."""
        cfg, network = self.cfg, self.cfg.network
        self.data = DataLink(DataSocket(self.ctx, bind_host=network.bind_host, port=network.data_port,
                                        advertise_host=network.advertise_host,
                                        advertise_port=network.advertise_data_port, faults=self.data_faults,
                                        max_frame_bytes=data_frame_limit_bytes(cfg)),
                             decode=decoder(cfg.run.run_id, staging))
        self.data_path = data_path_for(DataContext(
            cfg=cfg, stage=self.stage, worker_id=self.worker_id, model=self.model, replica=self.replica,
            staging=staging, data=self.data, peers=self.peers, counters=self.counters, metrics=self.metrics,
            log=self.log, leave_requested=self.leave_requested, graph_outputs=self.cuda_graphs), cfg.pipeline.stages)
        self.finish_rule = self.data_path.finish_rule(self.membership, steps,
                                                      upstream_lost_s=cfg.worker.upstream_lost_s,
                                                      upstream_gone_s=cfg.worker.upstream_gone_s)

    def _open_exchange(self, staging: HostStaging) -> None:
        """The outer step and all it talks through: the snapshot service and its server, the
        exchanger with readiness pairing as its fallback, and the device boundary they cross."""
        cfg, network = self.cfg, self.cfg.network
        boundary = ExchangeBoundary(staging, quantize_codec=quantizes_on_device(
            self.device.type, cfg.worker.snapshot_codec, faults_on=snapshot_faults_on(cfg)))
        self.snapshots = SnapshotService(cfg, self.stage, self.worker_id, metrics=self.metrics, log=self.log,
                                         blacklist=self.peers.blacklist, boundary=boundary,
                                         expected_shapes=[tuple(t.shape) for t in self.replica.fast])
        self.exchange_server = ExchangeServer(self.ctx, bind_host=network.bind_host, port=network.exchange_port,
                                              advertise_host=network.advertise_host,
                                              advertise_port=network.advertise_exchange_port,
                                              handler=self.snapshots.handle,
                                              max_frame_bytes=exchange_frame_limit_bytes(cfg))
        readiness = ReadinessPairing(PairingQueue(self.membership.client, self.membership.keys, self.stage),
                                     worker_id=self.worker_id, exchange_addr=self.exchange_server.address,
                                     log=self.log)
        self.timeouts = stage_timeouts(sum(t.numel() for t in self.replica.slow), cfg.worker)
        self.exchanger = OuterExchanger(self.ctx, self.snapshots, self.peers, collect_s=self.timeouts.exchange_s,
                                        log=self.log, readiness=readiness)
        self.outer = OuterStep(cfg, exchanger=self.exchanger, service=self.snapshots, replica=self.replica,
                               peers=self.peers, counters=self.counters, metrics=self.metrics, log=self.log)

    def _stage_replica(self, memory: MemoryChoice) -> StageReplica:
        """Our stage's replica on our device, built as the memory plan chose."""
        (self.log.info if memory.fits else self.log.warning)(
            "memory_plan", max_inflight=memory.max_inflight, activation_checkpointing=memory.activation_checkpointing,
            planned_peak_gb=None if memory.peak_bytes is None else round(memory.peak_bytes / 1e9, 2),
            reason=memory.reason)
        replica = initial_replica(self.cfg, self.stage, device=self.device, model=self.model)
        if self.cfg.model.init_from:  # what a user asked for is said to be used (a checkpoint or peer still wins)
            self.log.info("init_from_loaded", path=self.cfg.model.init_from, stage=self.stage,
                          tensors=len(replica.slow), note="a checkpoint of ours or a live peer's state replaces it")
        return replica

    # -- what the membership table shows -------------------------------------------------

    def progress(self) -> WorkerProgress:
        """What the heartbeat publishes besides liveness (read by `up` and `status`)."""
        return self.counters.progress(queue_depth=self.data_path.queue_depth(), loss=self.inner.last_loss,
                                      tokens_per_s=self.data_path.ctx.tokens.per_s(),
                                      checkpoint_failed=self.checkpoint.writes.failed_total())

    def record(self, state: WorkerState) -> MemberRecord:
        return MemberRecord(worker_id=self.worker_id, run_id=self.cfg.run.run_id, stage=self.stage,
                            data_addr=self.data.address, exchange_addr=self.exchange_server.address, state=state,
                            # The cluster key (the same for all): shows operators which key a worker runs with.
                            public_key=self.data.curve.public_key.decode() if self.data.curve else "",
                            heartbeat_time=time.time(), name=self.name,
                            metrics_addr=self.metrics_addr, site=self.cfg.worker.site, **asdict(self.progress()))

    # -- lifecycle ------------------------------------------------------------------------

    def run(self) -> int:
        try:
            self.start()
        except BaseException:  # e.g. refused to seed its stage: gone from the table, threads stopped
            self.membership.leave()
            self.close()
            raise
        try:
            with self.inner.host_reads or contextlib.nullcontext():  # counts this thread only
                while not self.finish_rule.finished() and not self.leave_requested.is_set():
                    self.tick()
            if self.leave_requested.is_set():
                self.leave()
                return self.cfg.worker.left_exit_code  # not done: an orchestrator may replace us
            self.finish()
        finally:
            self.close()
        return 0

    def start(self) -> None:
        self.exchange_server.start()
        self.data.start()
        if not self.membership.register(self.record(WorkerState.JOINING)):  # Redis went away since start-up
            wait_for_redis(lambda: self.membership.register(self.record(WorkerState.JOINING)),
                           url=self.cfg.network.redis_url, wait_s=self.cfg.worker.redis_wait_s, log=self.log)
        self.heartbeat = HeartbeatThread(self.membership, lambda: asdict(self.progress()),
                                         leave_event=self.leave_requested)
        self.heartbeat.start()
        self.views.start()
        name_kernel_threads()  # top -H, perf and benchmarks/thread_load.py tell them apart
        if self.data_faults is not None:
            self.log.warning("data_faults_injected", loss=self.data_faults.loss, delay_s=self.data_faults.delay_s,
                             note="chaos testing: outgoing data messages are dropped or delayed on purpose")
        self.log.info("worker_started", data_addr=self.data.address, exchange_addr=self.exchange_server.address,
                      device=str(self.device), method=self.outer.settings.method, h=self.outer.settings.h)
        self.data_path.open_data(self.name, self._starting_state().resume_or_bootstrap())
        self.snapshots.state_final(self.replica, self.counters.clock_steps, self.counters.outer_steps)
        self._reserve_pinned()
        self.membership.set_state(WorkerState.ONLINE)
        self.log.info("member_online")

    def _starting_state(self) -> StartingState:
        return StartingState(self.cfg, self.stage, self.worker_id, self.outer.settings.h, ctx=self.ctx,
                             membership=self.membership, peers=self.peers, snapshots=self.snapshots,
                             timeouts=self.timeouts, replica=self.replica, counters=self.counters,
                             checkpoint=self.checkpoint, durable=self.durable,
                             leave_requested=self.leave_requested, log=self.log)

    def _reserve_pinned(self) -> None:
        """On CUDA, the checkpoint's pinned buffer before training starts (the durable store's
        stays at first use: only the stage's elected writer needs one)."""
        if self.device.type != "cuda":
            return  # nothing is pinned elsewhere: no need to count the state's bytes
        started = time.monotonic()
        nbytes = self.checkpoint.pinned_state_bytes()
        if self.checkpoint.writes.reserve_pinned(nbytes):
            self.log.info("pinned_reserved", bytes=nbytes, seconds=round(time.monotonic() - started, 2))

    def tick(self) -> None:
        self.alive.touch()
        self.data_path.tick()
        self.inner.maybe_step()

    def _periodic_checkpoint(self) -> None:
        """The outer step is final: our checkpoint when one is due (written off this thread),
        our share of the durable store."""
        worker_cfg = self.cfg.worker
        if checkpoint_due(self.counters.outer_steps, every=worker_cfg.checkpoint_every,
                          interval_s=worker_cfg.checkpoint_interval_s,
                          since_write_s=self.checkpoint.writes.seconds_since_write()):
            self.checkpoint.save_in_background("periodic")
        if self.durable is not None:
            self.durable.after_outer_step(self.counters.outer_steps, self.counters.inner_steps,
                                          state=self.checkpoint.state_dict, cursor=self.data_path.cursor_state(),
                                          live_peer_ids=[m.worker_id for m in self.peers.members(self.stage)])

    def request_leave(self, *_: Any) -> None:
        self.leave_requested.set()
        if self.heartbeat is not None:  # it sleeps until its next beat: it leaves Redis now
            self.heartbeat.wake()

    def finish(self) -> None:
        """Our steps are done: LEAVING (peers stop routing to us) with the final figures, for
        observers; the stage marked finished for a later stage's finishing rule."""
        self.inner.take_last_steps()
        self.log.info("steps_done", inner_step=self.counters.inner_steps,
                      checkpoint_failed=self.checkpoint.writes.failed_total())
        self.outer.finish()
        self.membership.heartbeat(state=WorkerState.LEAVING, **asdict(self.progress()))
        # The final state is written before the marks: whoever the marks tell that the run is
        # over (a coordinator, `noloco-rt consensus --from-store`) finds it there.
        self.checkpoint.save("finished")
        if self.durable is not None:  # every replica's final state outlives its machine: the run's model
            self.durable.write_now(self.counters.outer_steps, self.counters.inner_steps,
                                   state=self.checkpoint.snapshot(), cursor=self.data_path.cursor_state())
        self.membership.mark_stage_finished(self.stage)
        if self.stage == self.cfg.pipeline.stages - 1:  # every upstream stage finished before us
            mark_run_finished(self.cfg, self.membership, name=self.name, log=self.log)
        self.membership.leave()

    def leave(self) -> None:
        """Graceful exit: gone from the table at once, in-flight work finished (or left to the
        upstream retry) within half the grace period, then a final checkpoint."""
        self.membership.leave()
        self.log.info("leaving", inflight=self.data_path.in_flight(), queued=self.data_path.queued())
        self.data_path.wind_down(time.monotonic() + self.cfg.worker.leave_grace_s / 2)
        self.outer.settle(final=True)
        self.exchanger.tell_last_round()  # we will not be there to answer a partner's question
        self.checkpoint.save("leave")
        if self.durable is not None:  # a pod's disk may not come back: keep our data stream's place
            self.durable.write_now(self.counters.outer_steps, self.counters.inner_steps, state=None,
                                   cursor=self.data_path.cursor_state(), wait_s=self.cfg.worker.leave_grace_s / 4)

    def close(self) -> None:
        self.checkpoint.writes.close()
        if self.durable is not None:
            self.durable.close()
        self.views.stop()
        if self.heartbeat is not None:
            self.heartbeat.stop()
        self.exchanger.close()
        self.exchange_server.stop()
        link = self.data.close(flush_s=LINK_FLUSH_S)
        faults = self.data_faults
        self.log.info("worker_summary", **self.counters.summary(), link=asdict(link),
                      rejected=merged_counts(self.data_path.ctx.rejected, self.snapshots.rejected),
                      checkpoint=self.checkpoint.writes.counts(),
                      **({"store": self.durable.counts()} if self.durable is not None else {}),
                      **({"injected_lost": faults.dropped, "injected_delayed": faults.delayed} if faults else {}))


def default_worker_name(stage: int) -> str:
    return f"{socket.gethostname()}-s{stage}-r{os.environ.get('LOCAL_RANK', '0')}"


def install_signal_handlers(worker: StageWorker) -> None:
    """SIGTERM (spot preemption, pod deletion) and SIGINT ask for a graceful leave."""
    signal.signal(signal.SIGTERM, worker.request_leave)
    signal.signal(signal.SIGINT, worker.request_leave)
