"""`noloco-rt worker --stage K`: one replica of one pipeline stage.

The main thread trains (DESIGN §3): the first stage reads its data shard and sends
activations to a next-stage worker chosen among live ONLINE ones (power of two
choices); a middle stage forwards what it receives; the last stage computes the loss
and sends the input gradient back to the exact sender. A worker accepts at most B
forwards, then handles only gradients until every one is back or dropped, steps, and
goes on, so no optimizer step touches weights an in-flight microbatch still needs.
Every H inner steps it takes the outer step with one random live peer of its stage
(workers/exchange.py). A background thread serves snapshots; another heartbeats.
"""

from __future__ import annotations

import collections
import itertools
import os
import signal
import socket
import threading
import time
import uuid
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import zmq

from noloco_rt.algo.optim import OuterCoefficients
from noloco_rt.algo.replica import StageReplica
from noloco_rt.checkpoint import load_checkpoint, save_checkpoint
from noloco_rt.config import Config
from noloco_rt.data import DataCursor, ShardedBatches, load_corpus
from noloco_rt.logs import get_logger
from noloco_rt.membership.peers import PeerView
from noloco_rt.membership.table import HeartbeatThread, MemberRecord, Membership, WorkerState
from noloco_rt.model import lm_loss
from noloco_rt.net import messages
from noloco_rt.net.transport import DataSocket, ExchangeServer
from noloco_rt.net.wire import MessageKind, WireReject
from workers.cluster.faults import DataFaults
from workers.data_path.deadlines import DeadlinePolicy, LatencyTracker
from workers.data_path.inflight import InflightTable
from workers.exchange import SnapshotService, bootstrap_from_peer, exchange_with_peer
from workers.methods import worker_method_error
from workers.metrics import WorkerMetrics

RECEIVE_POLL_S = 0.05
SEND_TIMEOUT_S = 1.0
UPSTREAM_CHECK_S = 0.5
UPSTREAM_GONE_S = 5.0


def pick_device(local_rank: int) -> torch.device:
    """CUDA when present (one device per local rank), else CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


class HostStaging:
    """Device <-> host copies for the wire; on CUDA through pinned buffers reused per shape."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._pinned: dict[tuple[tuple[int, ...], torch.dtype], torch.Tensor] = {}

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.detach()
        if self.device.type != "cuda":
            return tensor.contiguous()
        key = (tuple(tensor.shape), tensor.dtype)
        buffer = self._pinned.get(key)
        if buffer is None:
            buffer = self._pinned[key] = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        buffer.copy_(tensor, non_blocking=True)
        torch.cuda.current_stream(self.device).synchronize()
        return buffer.clone()  # the wire keeps a reference while ZeroMQ sends it; the buffer is reused

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.device.type != "cuda":
            return tensor
        return tensor.pin_memory().to(self.device, non_blocking=True)


@dataclass
class Counters:
    inner_steps: int = 0
    outer_steps: int = 0
    peer_exchanges: int = 0
    local_outer_steps: int = 0
    microbatches_done: int = 0
    sent: int = 0
    """Microbatches this worker originated (first attempts only; retries are counted in `retried`)."""
    retried: int = 0
    dropped: int = 0
    routed_to: collections.Counter = field(default_factory=collections.Counter)


class StageWorker:
    def __init__(self, cfg: Config, stage: int, *, membership: Membership, ctx: zmq.Context,
                 name: str, device: torch.device, checkpoint_path: Path, metrics: WorkerMetrics,
                 max_steps: int | None = None, data_faults: DataFaults | None = None) -> None:
        if (why := worker_method_error(cfg.outer.method)) is not None:
            raise ValueError(why)
        if not 0 <= stage < cfg.pipeline.stages:
            raise ValueError(f"--stage must be in [0, {cfg.pipeline.stages}), got {stage}")
        self.cfg = cfg
        self.stage = stage
        self.num_stages = cfg.pipeline.stages
        self.is_first = stage == 0
        self.is_last = stage == self.num_stages - 1
        self.membership = membership
        self.ctx = ctx
        self.name = name
        self.device = device
        self.checkpoint_path = checkpoint_path
        self.metrics = metrics
        self.max_steps = max_steps if max_steps is not None else cfg.run.steps
        # A fresh id per incarnation: a quick restart must not be mistaken for the process it replaces.
        self.worker_id = uuid.uuid4().hex
        self.log = get_logger(run=cfg.run.run_id, worker=self.worker_id[:8], stage=stage, name=name)
        self.outer = cfg.outer.resolved()
        self.coeffs = OuterCoefficients.from_config(self.outer)
        self.replica = StageReplica.create(cfg, stage, device=device)
        self.staging = HostStaging(device)
        self.counters = Counters()
        self.inflight = InflightTable()
        self.latency = LatencyTracker(DeadlinePolicy(floor_s=cfg.worker.deadline_floor_s,
                                                     ceiling_s=cfg.worker.deadline_ceiling_s,
                                                     initial_s=min(max(10.0, cfg.worker.deadline_floor_s),
                                                                   cfg.worker.deadline_ceiling_s)))
        self.microbatch_ids = itertools.count()
        self.seen: collections.OrderedDict[tuple[str, int, int], None] = collections.OrderedDict()
        self.pending_forwards: collections.deque[messages.DataMessage] = collections.deque()
        self.accepted_this_step = 0
        self.sent_this_step = 0
        self.losses: list[float] = []
        self.last_loss: float | None = None
        """Mean training loss of the last inner step (stages that compute the loss)."""
        self._upstream_checked_at = float("-inf")
        self._upstream_gone_since: float | None = None
        self._upstream_seen = False
        self.metrics_addr = ""
        """host:port of the Prometheus endpoint, published in the membership record."""
        self.leave_requested = threading.Event()
        self.batches: ShardedBatches | None = None
        self.data = DataSocket(ctx, bind_host=cfg.network.bind_host, port=cfg.network.data_port,
                               advertise_host=cfg.network.advertise_host,
                               faults=data_faults)
        self.snapshots = SnapshotService(cfg, stage, self.worker_id, metrics=metrics, log=self.log,
                                         expected_shapes=[tuple(t.shape) for t in self.replica.fast])
        self.exchange_server = ExchangeServer(ctx, bind_host=cfg.network.bind_host, port=cfg.network.exchange_port,
                                              advertise_host=cfg.network.advertise_host,
                                              handler=self.snapshots.handle)
        self.peers = PeerView(membership, own_id=self.worker_id)
        self.heartbeat: HeartbeatThread | None = None
        self._tokens_window: collections.deque[tuple[float, int]] = collections.deque(maxlen=64)

    # -- lifecycle ----------------------------------------------------------------------

    def record(self, state: WorkerState) -> MemberRecord:
        return MemberRecord(worker_id=self.worker_id, run_id=self.cfg.run.run_id, stage=self.stage,
                            data_addr=self.data.address, exchange_addr=self.exchange_server.address, state=state,
                            # The cluster key (the same for all): shows operators which key a worker runs with.
                            public_key=self.data.curve.public_key.decode() if self.data.curve else "",
                            heartbeat_time=time.time(), name=self.name,
                            metrics_addr=self.metrics_addr, **self.progress())

    def progress(self) -> dict[str, Any]:
        """What the heartbeat publishes besides liveness (read by `up` and `status`)."""
        c = self.counters
        return {"outer_step": c.outer_steps, "queue_depth": self.queue_depth(), "inner_step": c.inner_steps,
                "loss": self.last_loss, "tokens_per_s": round(self._tokens_per_s(), 1),
                "peer_exchanges": c.peer_exchanges, "local_outer_steps": c.local_outer_steps,
                "retried": c.retried, "dropped": c.dropped}

    def queue_depth(self) -> int:
        return len(self.inflight) + len(self.pending_forwards)

    def start(self) -> None:
        self.exchange_server.start()
        self.membership.register(self.record(WorkerState.JOINING))
        self.heartbeat = HeartbeatThread(self.membership, self.progress, leave_event=self.leave_requested)
        self.heartbeat.start()
        if self.data.faults is not None:
            self.log.warning("data_faults_injected", loss=self.data.faults.loss, delay_s=self.data.faults.delay_s,
                             note="chaos testing: outgoing data messages are dropped or delayed on purpose")
        self.log.info("worker_started", data_addr=self.data.address, exchange_addr=self.exchange_server.address,
                      device=str(self.device), method=self.outer.method, h=self.outer.h)
        cursor = self._restore_state()
        if self.is_first:
            corpus = load_corpus(self.cfg.data, vocab_size=self.cfg.model.vocab_size)
            # Each first-stage worker reads its own permutation of the corpus, fixed by its name,
            # so a restarted worker resumes the same stream from its checkpointed cursor.
            seed = (self.cfg.run.seed * 1_000_003 + zlib.crc32(self.name.encode())) % 2**32
            self.batches = ShardedBatches(corpus.train, seq_len=self.cfg.model.seq_len,
                                          batch_size=self.cfg.data.batch_size, shard=0, num_shards=1, seed=seed,
                                          cursor=cursor)
        self.snapshots.publish_bootstrap(self.replica, self.counters.inner_steps, self.counters.outer_steps)
        self.membership.set_state(WorkerState.ONLINE)
        self.log.info("member_online")

    def _restore_state(self) -> DataCursor | None:
        state = load_checkpoint(self.checkpoint_path, run_id=self.cfg.run.run_id, stage=self.stage)
        if state is not None:
            self._load_state(state)
            self.log.info("resumed_checkpoint", path=str(self.checkpoint_path), inner_step=self.counters.inner_steps,
                          outer_step=self.counters.outer_steps)
            return DataCursor.from_state_dict(state["cursor"]) if state.get("cursor") else None
        deadline = time.monotonic() + self.cfg.worker.bootstrap_timeout_s
        while time.monotonic() < deadline and not self.leave_requested.is_set():
            donors = self.peers.random_peers(self.stage)
            if not donors:
                self.log.info("first_of_stage", note="initialised from the run seed")
                return None
            for donor in donors:
                result = bootstrap_from_peer(self.ctx, donor, self.snapshots, timeout_s=self.cfg.worker.exchange_timeout_s)
                if result is None:
                    self.peers.blacklist.fail(donor.worker_id)
                    continue
                slow, momentum, counters, checksum = result
                with torch.no_grad():
                    for target, source in zip(self.replica.slow, slow, strict=True):
                        target.copy_(source.to(self.device))
                    for target, source in zip(self.replica.fast, slow, strict=True):
                        target.copy_(source.to(self.device))
                    for target, source in zip(self.replica.momentum, momentum, strict=True):
                        target.copy_(source.to(self.device))
                self.counters.inner_steps = counters["inner_steps"]
                self.counters.outer_steps = counters["outer_steps"]
                self.replica.inner.steps_taken = counters["inner_steps"]
                self.log.info("bootstrapped", donor=donor.worker_id[:8], checksum=checksum,
                              inner_step=self.counters.inner_steps, outer_step=self.counters.outer_steps)
                return None
            self.peers.invalidate(self.stage)
            time.sleep(0.2)
        raise RuntimeError(f"no peer of stage {self.stage} served a bootstrap within "
                           f"{self.cfg.worker.bootstrap_timeout_s} s")

    def _state_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.cfg.run.run_id, "stage": self.stage, "name": self.name,
            "slow": [t.cpu() for t in self.replica.slow], "fast": [t.cpu() for t in self.replica.fast],
            "momentum": [t.cpu() for t in self.replica.momentum],
            "inner_optimizer": self.replica.inner.state_dict(),
            "counters": {"inner_steps": self.counters.inner_steps, "outer_steps": self.counters.outer_steps},
            "cursor": self.batches.cursor.state_dict() if self.batches else None,
        }

    def _load_state(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            for key, tensors in (("slow", self.replica.slow), ("fast", self.replica.fast),
                                 ("momentum", self.replica.momentum)):
                for target, source in zip(tensors, state[key], strict=True):
                    target.copy_(source.to(self.device))
        self.replica.inner.load_state_dict(state["inner_optimizer"])
        self.counters.inner_steps = int(state["counters"]["inner_steps"])
        self.counters.outer_steps = int(state["counters"]["outer_steps"])

    def save(self, reason: str) -> None:
        save_checkpoint(self.checkpoint_path, self._state_dict())
        self.log.info("checkpoint_written", reason=reason, path=str(self.checkpoint_path),
                      inner_step=self.counters.inner_steps)

    def request_leave(self, *_: Any) -> None:
        self.leave_requested.set()

    def run(self) -> int:
        self.start()
        try:
            while not self._finished() and not self.leave_requested.is_set():
                self.tick()
            if self.leave_requested.is_set():
                self.leave()
            else:
                self.log.info("steps_done", inner_step=self.counters.inner_steps)
                # LEAVING (peers stop routing to us) with the final figures, for observers.
                self.membership.heartbeat(state=WorkerState.LEAVING, **self.progress())
                self.membership.mark_stage_finished(self.stage)
                self.save("finished")
                self.membership.leave()
        finally:
            self.close()
        return 0

    def _finished(self) -> bool:
        """run.steps counts the first stage's inner steps (the data consumed). A later stage
        is done when every upstream worker has finished and nothing of its own is in flight,
        whatever its own step count: routing shares microbatches unequally between the
        workers of a stage, so counting our own steps could wait for forwards that never come.

        "Every upstream worker has finished": none is live in the table for UPSTREAM_GONE_S
        (a margin over a restarting upstream's absence), while Redis answers, and we either
        saw one live or one marked its stage finished (we restarted after they left)."""
        if self.is_first:
            return self.counters.inner_steps >= self.max_steps
        if len(self.inflight) or self.pending_forwards:
            return False
        now = time.monotonic()
        if now - self._upstream_checked_at >= UPSTREAM_CHECK_S:
            self._upstream_checked_at = now
            self._check_upstream(now)
        return self._upstream_gone_since is not None and now - self._upstream_gone_since >= UPSTREAM_GONE_S

    def _check_upstream(self, now: float) -> None:
        upstream = self.membership.live_members(stage=self.stage - 1,
                                                states={WorkerState.JOINING, WorkerState.ONLINE})
        self._upstream_seen = self._upstream_seen or bool(upstream)
        gone = (not upstream and self.membership.redis_available
                and (self._upstream_seen or self.membership.stage_finished(self.stage - 1)))
        if not gone:
            self._upstream_gone_since = None
        elif self._upstream_gone_since is None:
            self._upstream_gone_since = now

    def leave(self) -> None:
        """Graceful exit: gone from the table at once, in-flight work finished (or left to the
        upstream retry) within half the grace period, then a final checkpoint."""
        self.membership.leave()
        self.log.info("leaving", inflight=len(self.inflight), queued=len(self.pending_forwards))
        deadline = time.monotonic() + self.cfg.worker.leave_grace_s / 2
        self.pending_forwards.clear()  # never accepted: their senders will re-route them
        while len(self.inflight) and time.monotonic() < deadline:
            self._receive_one(accept_forwards=False)
            self._handle_expired(resend=False)
        # Still unanswered after the grace: lost with our exit, and counted so that
        # sent == trained + dropped holds for every graceful exit (the chaos driver checks it).
        for entry in self.inflight.expired(float("inf")):
            self.inflight.abandon(entry.microbatch_id)
            self._drop(entry.microbatch_id, "leaving")
        self.save("leave")

    def close(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()
        self.exchange_server.stop()
        self.data.close()
        c = self.counters
        self.log.info("worker_summary", inner_steps=c.inner_steps, outer_steps=c.outer_steps,
                      peer_exchanges=c.peer_exchanges, local_outer_steps=c.local_outer_steps,
                      microbatches=c.microbatches_done, sent=c.sent, retried=c.retried, dropped=c.dropped,
                      routed_to=dict(c.routed_to), rejected=dict(self.snapshots.rejects),
                      **({"injected_lost": self.data.faults.dropped, "injected_delayed": self.data.faults.delayed}
                         if self.data.faults else {}))

    # -- the training loop --------------------------------------------------------------

    def tick(self) -> None:
        if self.is_first and self.is_last:
            self._train_alone()
        elif self.is_first:
            self._first_stage_tick()
        else:
            self._receive_one(accept_forwards=True)
            self._drain_pending()
        if not self.is_last:
            self._handle_expired(resend=True)
        self._maybe_step()

    def _train_alone(self) -> None:
        assert self.batches is not None
        inputs, targets = self.batches.next_batch()
        loss = lm_loss(self.replica.module(inputs.to(self.device)), targets.to(self.device))
        loss.backward()
        self.replica.pending_microbatches += 1
        self.losses.append(loss.item())
        self.accepted_this_step += 1
        self._count_tokens(inputs.numel())

    def _first_stage_tick(self) -> None:
        assert self.batches is not None
        if self.sent_this_step < self.cfg.pipeline.max_inflight:
            peer = self.peers.choose_next_hop(self.stage + 1, self.cfg.routing.policy)
            if peer is None:
                self._receive_one(accept_forwards=False)  # nobody downstream yet: keep serving gradients
                self.peers.invalidate(self.stage + 1)
                return
            inputs, targets = self.batches.next_batch()
            output = self.replica.module(inputs.to(self.device))  # (B, T, C) with its graph
            mb_id = next(self.microbatch_ids)
            frames = messages.forward(self.cfg.run.run_id, self.worker_id, self.stage, mb_id, self.data.address,
                                      self.staging.to_host(output), targets)
            self.inflight.add(mb_id, peer=peer.worker_id, now=time.monotonic(), deadline_s=self.latency.deadline_s(),
                              payload=frames, context=output)
            self.sent_this_step += 1
            self.counters.sent += 1
            self._count_tokens(inputs.numel())
            if not self._send_to(peer, frames, mb_id):
                self._resend(mb_id)
            return
        self._receive_one(accept_forwards=False)

    def _send_to(self, peer: MemberRecord, message: messages.Outgoing, mb_id: int) -> bool:
        if self.data.send(peer.data_addr, message.parts(), timeout_s=SEND_TIMEOUT_S):
            self.counters.routed_to[peer.worker_id[:8]] += 1
            self.peers.local_load[peer.worker_id] = self.peers.local_load.get(peer.worker_id, 0) + 1
            self.metrics.forwarded.inc()
            return True
        self.log.warning("send_failed", peer=peer.worker_id[:8], microbatch=mb_id)
        self.peers.blacklist.fail(peer.worker_id)
        self.data.forget(peer.data_addr)
        return False

    def _resend(self, mb_id: int) -> None:
        """Re-send microbatch mb_id to another live worker (new attempt id), or drop it once
        max_retries attempts have failed or nobody is left to take it."""
        entry = self.inflight.get(mb_id)
        if entry is None:
            return
        while entry.attempt < self.cfg.worker.max_retries:
            self.peers.local_load[entry.peer] = max(0, self.peers.local_load.get(entry.peer, 0) - 1)
            peer = (self.peers.choose_next_hop(self.stage + 1, self.cfg.routing.policy, exclude={entry.peer})
                    or self.peers.choose_next_hop(self.stage + 1, self.cfg.routing.policy))
            if peer is None:
                break
            self.inflight.retry(mb_id, peer=peer.worker_id, now=time.monotonic(), deadline_s=self.latency.deadline_s())
            frames = messages.with_attempt(entry.payload, entry.attempt)
            entry.payload = frames
            self.counters.retried += 1
            self.metrics.retried.inc()
            self.log.info("microbatch_retried", microbatch=mb_id, attempt=entry.attempt, peer=peer.worker_id[:8])
            if self._send_to(peer, frames, mb_id):
                return
        self.inflight.abandon(mb_id)
        self._drop(mb_id, "retries_exhausted")

    def _drop(self, mb_id: int, reason: str) -> None:
        self.counters.dropped += 1
        self.metrics.dropped.labels(reason=reason).inc()
        self.log.warning("microbatch_dropped", microbatch=mb_id, reason=reason)

    def _handle_expired(self, *, resend: bool) -> None:
        for entry in self.inflight.expired(time.monotonic()):
            self.peers.blacklist.fail(entry.peer)
            if resend:
                self._resend(entry.microbatch_id)
            else:
                self.inflight.abandon(entry.microbatch_id)
                self._drop(entry.microbatch_id, "leaving")

    def _receive_one(self, *, accept_forwards: bool) -> None:
        frames = self.data.receive(RECEIVE_POLL_S)
        if frames is None:
            return
        try:
            message = messages.decode(frames, run_id=self.cfg.run.run_id)
        except WireReject as reject:
            self.snapshots.count_reject(reject.reason)
            return
        key = (message.sender, message.microbatch_id, message.attempt)
        if key in self.seen:
            self.metrics.dropped.labels(reason="duplicate").inc()
            return
        self.seen[key] = None
        if len(self.seen) > 4096:
            self.seen.popitem(last=False)
        if message.kind == MessageKind.BACKWARD:
            self._on_gradient(message)
        elif message.kind == MessageKind.FORWARD and not self.is_first:
            if not accept_forwards or self.leave_requested.is_set():
                return  # leaving: the sender's deadline re-routes it
            if message.stage != self.stage - 1 or not self._forward_ok(message):
                self.snapshots.count_reject("wrong_stage_or_shape")
                return
            self._upstream_seen = True
            self.pending_forwards.append(message)
        else:
            self.snapshots.count_reject("unexpected_kind")

    def _forward_ok(self, message: messages.DataMessage) -> bool:
        """Activations (B, T, C) and targets (B, T) of the run's shapes, targets inside the vocabulary."""
        batch, seq = self.cfg.data.batch_size, self.cfg.model.seq_len
        activations, targets = message.tensors
        if tuple(activations.shape) != (batch, seq, self.replica.module.shape.dim) or \
                tuple(targets.shape) != (batch, seq):
            return False
        return bool(targets.numel() == 0 or (int(targets.min()) >= 0
                                             and int(targets.max()) < self.cfg.model.vocab_size))

    def _drain_pending(self) -> None:
        while self.pending_forwards and self.accepted_this_step < self.cfg.pipeline.max_inflight:
            self._on_forward(self.pending_forwards.popleft())

    def _on_forward(self, message: messages.DataMessage) -> None:
        hidden_in = self.staging.to_device(message.tensors[0]).requires_grad_(True)
        self.accepted_this_step += 1
        if self.is_last:
            targets = message.tensors[1].to(self.device)
            loss = lm_loss(self.replica.module(hidden_in), targets)
            loss.backward()
            self.replica.pending_microbatches += 1
            self.losses.append(loss.item())
            self.metrics.loss.set(self.losses[-1])
            self._count_tokens(targets.numel())
            self._reply_gradient(message, hidden_in.grad)
            return
        output = self.replica.module(hidden_in)
        peer = self.peers.choose_next_hop(self.stage + 1, self.cfg.routing.policy)
        mb_id = next(self.microbatch_ids)
        frames = messages.forward(self.cfg.run.run_id, self.worker_id, self.stage, mb_id, self.data.address,
                                  self.staging.to_host(output), message.tensors[1])
        self.inflight.add(mb_id, peer=peer.worker_id if peer else "", now=time.monotonic(),
                          deadline_s=self.latency.deadline_s(), payload=frames,
                          context=(output, hidden_in, message))
        self.counters.sent += 1
        self._count_tokens(message.tensors[1].numel())
        if peer is None or not self._send_to(peer, frames, mb_id):
            self._resend(mb_id)

    def _on_gradient(self, message: messages.DataMessage) -> None:
        entry = self.inflight.resolve(message.microbatch_id, message.attempt)
        if entry is None:
            self.metrics.dropped.labels(reason="late_or_duplicate").inc()
            return
        self.latency.observe(time.monotonic() - entry.sent_at)
        self.peers.blacklist.succeed(entry.peer)
        self.peers.local_load[entry.peer] = max(0, self.peers.local_load.get(entry.peer, 0) - 1)
        grad = self.staging.to_device(message.tensors[0])
        if self.is_first:
            output = entry.context
            if grad.shape != output.shape:
                self.snapshots.count_reject("gradient_shape")
                self._drop(message.microbatch_id, "gradient_shape")
                return
            output.backward(grad)
        else:
            output, hidden_in, upstream = entry.context
            if grad.shape != output.shape:
                self.snapshots.count_reject("gradient_shape")
                self._drop(message.microbatch_id, "gradient_shape")
                return
            output.backward(grad)
            self._reply_gradient(upstream, hidden_in.grad)
        self.replica.pending_microbatches += 1
        self.counters.microbatches_done += 1
        self.metrics.backwarded.inc()

    def _reply_gradient(self, upstream: messages.DataMessage, grad: torch.Tensor) -> None:
        reply = messages.backward(self.cfg.run.run_id, self.worker_id, self.stage, upstream.microbatch_id,
                                  upstream.attempt, self.staging.to_host(grad))
        if not self.data.send(upstream.reply_to, reply.parts(), timeout_s=SEND_TIMEOUT_S):
            # The origin died or is unreachable: its microbatch is lost with it.
            self.data.forget(upstream.reply_to)
            self._drop(upstream.microbatch_id, "origin_unreachable")
        if self.is_last:
            self.counters.microbatches_done += 1

    # -- steps --------------------------------------------------------------------------

    def _maybe_step(self) -> None:
        budget = self.cfg.pipeline.max_inflight
        if self.is_first and not self.is_last:
            ready = self.sent_this_step >= budget and len(self.inflight) == 0
        else:
            ready = self.accepted_this_step >= budget and len(self.inflight) == 0
        if not ready:
            return
        if self.replica.has_gradients():
            self.replica.finish_inner_step()
            self.counters.inner_steps += 1
            self.metrics.inner_steps.inc()
            step = self.counters.inner_steps
            if self.losses:
                self.last_loss = sum(self.losses) / len(self.losses)
            if step % 10 == 0 or step == 1:
                fields = {"loss": round(self.last_loss, 4)} if self.losses else {}
                self.log.info("train_progress", inner_step=step, tokens_per_s=round(self._tokens_per_s(), 1),
                              **fields)
            self.losses.clear()
            if self.counters.inner_steps % self.outer.h == 0:
                self.outer_step()
        else:
            self.replica.inner.optimizer.zero_grad(set_to_none=True)
        self.sent_this_step = 0
        self.accepted_this_step = 0
        self.metrics.queue_depth.set(self.queue_depth())

    def outer_step(self) -> None:
        target_step = self.counters.outer_steps + 1
        state = self.replica.outer_state(theta_only=self.coeffs.theta_shortcut)
        self.snapshots.publish_contribution(state, target_step)
        peer_state = None
        if self.outer.method == "noloco":
            peer_state = exchange_with_peer(self.ctx, self.peers, self.stage, self.snapshots, target_step,
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
            if self.outer.method == "noloco":
                self.log.warning("outer_step_local", outer_step=target_step, note="no peer answered")
        self.snapshots.publish_bootstrap(self.replica, self.counters.inner_steps, self.counters.outer_steps)
        every = self.cfg.worker.checkpoint_every
        if every and self.counters.outer_steps % every == 0:
            self.save("periodic")

    def _count_tokens(self, count: int) -> None:
        self.metrics.tokens.inc(count)
        self._tokens_window.append((time.monotonic(), count))
        self.metrics.tokens_per_s.set(self._tokens_per_s())

    def _tokens_per_s(self) -> float:
        if len(self._tokens_window) < 2:
            return 0.0
        span = self._tokens_window[-1][0] - self._tokens_window[0][0]
        total = sum(count for _, count in list(self._tokens_window)[1:])
        return total / span if span > 0 else 0.0


def default_worker_name(stage: int) -> str:
    return f"{socket.gethostname()}-s{stage}-r{os.environ.get('LOCAL_RANK', '0')}"


def install_signal_handlers(worker: StageWorker) -> None:
    """SIGTERM (spot preemption, pod deletion) and SIGINT ask for a graceful leave."""
    signal.signal(signal.SIGTERM, worker.request_leave)
    signal.signal(signal.SIGINT, worker.request_leave)
