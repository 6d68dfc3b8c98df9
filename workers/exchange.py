"""The outer exchange (DESIGN §4) and the joiner's bootstrap, both over the exchange socket.

A worker publishes, once per outer step, an immutable compressed snapshot of what its
peers need (θ, or φ and Δ when γ ≠ β) tagged with run, stage, outer step and checksum,
and after the step its slow weights, momentum and counters for joiners. A background
thread answers requests from those snapshots, so serving never blocks training.

At its outer step a worker sends its own snapshot to a random live peer of its stage
and gets the peer's back in the same round trip. The server keeps what requesters
sent; a worker that finds in that inbox a snapshot of a peer for its very outer step
uses it instead of asking someone else, so two workers that chose each other form
the symmetric pair of the paper. A server asked for outer step k before it reached k
waits briefly for its own step, then answers with what it has; the requester uses it
if it is within the staleness bound, else tries another peer.

Every received snapshot is validated in full (checksum, shapes, bounded decompression,
finite values) before it is kept or used, and a peer's contribution must lie within
worker.max_peer_distance_ratio of ours (noloco_rt.algo.peer_checks): a finite, well-formed
snapshot absurdly far from our weights is rejected as "too_far" and its sender
blacklisted. A joiner's bootstrap gets the structural checks only: it has no weights of
its own yet to compare with.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch
import zmq

from noloco_rt.algo.optim import PeerOuterState
from noloco_rt.algo.peer_checks import PeerCheck, check_peer_distance
from noloco_rt.config import Config
from noloco_rt.membership.table import MemberRecord
from noloco_rt.net.codec import (
    CodecError,
    EncodedTensors,
    TensorSpec,
    checksum,
    decode_tensors,
    encode_tensors,
)
from noloco_rt.net.transport import request
from noloco_rt.net.wire import (
    PROTOCOL_VERSION,
    Header,
    MessageKind,
    WireLimits,
    WireReject,
    decode_message,
    encode_message,
)

SNAPSHOT_LIMITS = WireLimits(max_frame_bytes=64 << 30, max_message_bytes=(64 << 30) + (1 << 20))
SERVER_WAIT_FOR_OWN_STEP_S = 2.0
# Snapshots peers sent us, kept for our next outer step: only a few are ever useful
# (one per partner), and a flood of requests from made-up senders must not grow memory.
MAX_INBOX = 8
# zstd's worst case grows incompressible input by well under 1 %; anything larger than
# the raw size plus this slack is not an honest snapshot.
PAYLOAD_SLACK_BYTES = 1 << 16


@dataclass(frozen=True)
class Snapshot:
    """Immutable once published: the header fields and the compressed payload."""

    outer_step: int
    parts_kind: str  # "fast" | "slow+grad" | "slow+momentum"
    encoded: EncodedTensors
    digest: str
    counters: dict[str, int]


def _encode(tensors: list[torch.Tensor], codec: str, outer_step: int, parts_kind: str,
            counters: dict[str, int] | None = None) -> Snapshot:
    encoded = encode_tensors([t.detach().float().cpu() for t in tensors], codec)
    return Snapshot(outer_step, parts_kind, encoded, checksum(encoded.payload), counters or {})


def _snapshot_message(kind: MessageKind, cfg: Config, stage: int, sender: str, snapshot: Snapshot | None) -> list[Any]:
    if snapshot is None:
        header = Header(version=PROTOCOL_VERSION, run_id=cfg.run.run_id, kind=kind, sender=sender, microbatch_id=0,
                        attempt=0, outer_step=-1, stage=stage, codec="raw", tensors=[], extra={})
        return encode_message(header, [])
    payload = snapshot.encoded.payload
    header = Header(version=PROTOCOL_VERSION, run_id=cfg.run.run_id, kind=kind, sender=sender, microbatch_id=0,
                    attempt=0, outer_step=snapshot.outer_step, stage=stage, codec="raw",
                    tensors=[{"shape": [len(payload)], "dtype": "uint8", "nbytes": len(payload)}],
                    extra={"codec": snapshot.encoded.codec, "parts": snapshot.parts_kind,
                           "specs": [[list(s.shape), s.dtype] for s in snapshot.encoded.specs],
                           "checksum": snapshot.digest, "counters": snapshot.counters})
    return encode_message(header, [payload])


class SnapshotRejected(ValueError):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class SnapshotService:
    """Publishes this worker's snapshots and answers peers' requests (called on the server thread)."""

    def __init__(self, cfg: Config, stage: int, worker_id: str, *, metrics: Any, log: Any,
                 expected_shapes: list[tuple[int, ...]]) -> None:
        self.cfg = cfg
        self.stage = stage
        self.worker_id = worker_id
        self.metrics = metrics
        self.log = log
        self.expected_shapes = expected_shapes
        self.max_decompressed_bytes = 2 * 4 * sum(_numel(s) for s in expected_shapes) + (1 << 20)
        self._contribution: Snapshot | None = None
        self._bootstrap: Snapshot | None = None
        self._published = threading.Condition()
        self._inbox: dict[str, tuple[float, Snapshot, PeerOuterState]] = {}
        self._own_state: PeerOuterState | None = None
        self._lock = threading.Lock()
        self.rejects: dict[str, int] = {}

    def count_reject(self, reason: Any) -> None:
        key = getattr(reason, "value", str(reason))
        with self._lock:
            self.rejects[key] = self.rejects.get(key, 0) + 1
        self.metrics.rejected.labels(reason=key).inc()

    # -- publishing (main thread) ---------------------------------------------------------

    def publish_contribution(self, state: PeerOuterState, outer_step: int) -> Snapshot:
        if state.fast is not None:
            parts, parts_kind = state.fast, "fast"
        else:
            assert state.slow is not None and state.outer_grad is not None
            parts, parts_kind = state.slow + state.outer_grad, "slow+grad"
        snapshot = _encode(_inject_faults(parts, self.cfg), self.cfg.worker.snapshot_codec, outer_step, parts_kind)
        with self._published:
            self._own_state = state  # the honest state: what peers' contributions are compared with
            self._contribution = snapshot
            self._published.notify_all()
        return snapshot

    @property
    def contribution(self) -> Snapshot | None:
        """The latest published outer-step snapshot."""
        return self._contribution

    def publish_bootstrap(self, replica: Any, inner_steps: int, outer_steps: int) -> None:
        # Lossless codec: a joiner must start from exactly the donor's slow weights.
        lossless = "shuffle-zstd" if "bf16" in self.cfg.worker.snapshot_codec else self.cfg.worker.snapshot_codec
        self._bootstrap = _encode(replica.slow + replica.momentum, lossless, outer_steps, "slow+momentum",
                                  {"inner_steps": inner_steps, "outer_steps": outer_steps})

    @property
    def own_state(self) -> PeerOuterState | None:
        """The (unfaulted) state behind the latest published contribution."""
        return self._own_state

    def _inbox_fresh(self, received_at: float) -> bool:
        return time.monotonic() - received_at < 2 * self.cfg.worker.exchange_timeout_s

    def take_inbox(self, outer_step: int) -> tuple[str, Snapshot, PeerOuterState] | None:
        """A validated snapshot a peer sent us for exactly this outer step (recently), if any."""
        with self._lock:
            for sender, (received_at, snapshot, state) in list(self._inbox.items()):
                if snapshot.outer_step == outer_step and self._inbox_fresh(received_at):
                    del self._inbox[sender]
                    return sender, snapshot, state
        return None

    def _keep_in_inbox(self, sender: str, snapshot: Snapshot, state: PeerOuterState) -> None:
        with self._lock:
            for key, (received_at, _, _) in list(self._inbox.items()):
                if not self._inbox_fresh(received_at):
                    del self._inbox[key]
            self._inbox.pop(sender, None)
            while len(self._inbox) >= MAX_INBOX:  # oldest first (dicts keep insertion order)
                del self._inbox[next(iter(self._inbox))]
            self._inbox[sender] = (time.monotonic(), snapshot, state)

    # -- serving (server thread) ----------------------------------------------------------

    def handle(self, frames: list[zmq.Frame]) -> list[Any]:
        try:
            decoded = decode_message(frames, expected_run_id=self.cfg.run.run_id, limits=SNAPSHOT_LIMITS)
        except WireReject as reject:
            self.count_reject(reject.reason)
            return _snapshot_message(MessageKind.ERROR, self.cfg, self.stage, self.worker_id, None)
        header = decoded.header
        if header.stage != self.stage:
            self.count_reject("wrong_stage")
            return _snapshot_message(MessageKind.ERROR, self.cfg, self.stage, self.worker_id, None)
        kind = MessageKind(header.kind)
        if kind == MessageKind.BOOTSTRAP_REQUEST:
            snapshot = self._bootstrap
            # The coordinator pulls the same snapshot read-only, often: not worth a log line.
            if snapshot is not None and not header.extra.get("observer"):
                self.log.info("bootstrap_served", to=header.sender[:8], checksum=snapshot.digest,
                              outer_step=snapshot.outer_step)
            return _snapshot_message(MessageKind.BOOTSTRAP_REPLY, self.cfg, self.stage, self.worker_id, snapshot)
        if kind != MessageKind.SNAPSHOT_REQUEST:
            self.count_reject("unexpected_kind")
            return _snapshot_message(MessageKind.ERROR, self.cfg, self.stage, self.worker_id, None)
        try:
            # Decoded here, on the server thread, not at use: a zstd bomb or NaN payload is
            # refused at once with an ERROR, and the inbox holds only usable states.
            theirs = self.read_snapshot(decoded)
            if theirs.parts_kind == "slow+momentum":
                raise SnapshotRejected("wrong_parts")
            their_state = self.peer_state(theirs)
        except SnapshotRejected as rejected:
            self.count_reject(rejected.reason)
            return _snapshot_message(MessageKind.ERROR, self.cfg, self.stage, self.worker_id, None)
        self._keep_in_inbox(header.sender, theirs, their_state)
        with self._published:  # a requester a little ahead of us: give our own step a moment
            self._published.wait_for(lambda: self._contribution is not None
                                     and self._contribution.outer_step >= header.outer_step,
                                     timeout=SERVER_WAIT_FOR_OWN_STEP_S)
            mine = self._contribution
        return _snapshot_message(MessageKind.SNAPSHOT_REPLY, self.cfg, self.stage, self.worker_id, mine)

    # -- validation -------------------------------------------------------------------------

    def read_snapshot(self, decoded: Any) -> Snapshot:
        """Rebuild a Snapshot from a decoded message, verifying checksum and specs."""
        header = decoded.header
        extra = header.extra
        if not decoded.tensors or "specs" not in extra:
            raise SnapshotRejected("empty_snapshot")
        if decoded.tensors[0].numel() > self.max_decompressed_bytes + PAYLOAD_SLACK_BYTES:
            raise SnapshotRejected("payload_too_large")
        payload = decoded.tensors[0].numpy().tobytes()
        if checksum(payload) != extra.get("checksum"):
            raise SnapshotRejected("checksum")
        try:
            specs = [TensorSpec(shape=tuple(int(d) for d in shape), dtype=str(dtype)) for shape, dtype in extra["specs"]]
        except (TypeError, ValueError):
            raise SnapshotRejected("malformed_specs") from None
        parts_kind = str(extra.get("parts", ""))
        copies = 1 if parts_kind == "fast" else 2
        if parts_kind not in ("fast", "slow+grad", "slow+momentum") or \
                [s.shape for s in specs] != self.expected_shapes * copies:
            raise SnapshotRejected("shape_mismatch")
        encoded = EncodedTensors(codec=str(extra.get("codec")), specs=specs, payload=payload,
                                 raw_bytes=sum(4 * _numel(s.shape) for s in specs), wire_bytes=len(payload))
        counters = extra.get("counters") or {}
        return Snapshot(header.outer_step, parts_kind, encoded, str(extra["checksum"]),
                        {str(k): int(v) for k, v in counters.items()})

    def tensors_of(self, snapshot: Snapshot) -> list[torch.Tensor]:
        try:
            tensors = decode_tensors(snapshot.encoded, max_decompressed_bytes=self.max_decompressed_bytes)
        except CodecError as exc:
            raise SnapshotRejected("codec") from exc
        if not all(bool(torch.isfinite(t).all()) for t in tensors):
            raise SnapshotRejected("non_finite")
        return tensors

    def peer_state(self, snapshot: Snapshot) -> PeerOuterState:
        tensors = self.tensors_of(snapshot)
        if snapshot.parts_kind == "fast":
            return PeerOuterState(fast=tensors)
        half = len(tensors) // 2
        return PeerOuterState(slow=tensors[:half], outer_grad=tensors[half:])


def _inject_faults(parts: list[torch.Tensor], cfg: Config) -> list[torch.Tensor]:
    """FAULT INJECTION for tests and chaos runs (worker.fault_*; off by default): what a
    broken or hostile peer would serve. Never touches the worker's own weights."""
    scale, nan = cfg.worker.fault_scale_snapshot, cfg.worker.fault_nan_snapshot
    if scale == 1.0 and not nan:
        return parts
    faulty = [t.detach().float() * scale for t in parts]
    if nan and faulty and faulty[0].numel():
        faulty[0].view(-1)[0] = math.nan
    return faulty


def _reject_peer(service: SnapshotService, peers: Any, peer_id: str, reason: str, **fields: Any) -> None:
    """Count a bad contribution, blacklist its sender and say so."""
    service.count_reject(reason)
    avoid_s = peers.blacklist.fail(peer_id)
    service.log.warning("peer_snapshot_rejected", peer=peer_id[:8], reason=reason, blacklisted_s=avoid_s, **fields)


def _distance_check(service: SnapshotService, state: PeerOuterState) -> PeerCheck:
    """The peer's distance from our own published state (always ok before we published one)."""
    own = service.own_state
    if own is None:
        return PeerCheck({}, service.cfg.worker.max_peer_distance_ratio)
    return check_peer_distance(state, own, max_ratio=service.cfg.worker.max_peer_distance_ratio)


def _rounded(ratios: dict[str, float]) -> dict[str, float]:
    return {k: float(f"{v:.4g}") if math.isfinite(v) else v for k, v in ratios.items()}


def _numel(shape: tuple[int, ...] | list[int]) -> int:
    total = 1
    for d in shape:
        total *= int(d)
    return total


def exchange_with_peer(ctx: zmq.Context, peers: Any, stage: int, service: SnapshotService, outer_step: int, *,
                       attempts: int, timeout_s: float) -> PeerOuterState | None:
    """The group partner's state for this outer step, or None (then the step is local)."""
    cfg = service.cfg
    from_inbox = service.take_inbox(outer_step)
    if from_inbox is not None:
        sender, snapshot, state = from_inbox  # validated when it arrived
        check = _distance_check(service, state)
        if not check.ok:
            _reject_peer(service, peers, sender, "too_far", ratios=_rounded(check.ratios), via="inbox")
        else:
            service.log.info("peer_exchange_done", peer=sender[:8], outer_step=outer_step, via="inbox",
                             wire_bytes=snapshot.encoded.wire_bytes, raw_bytes=snapshot.encoded.raw_bytes,
                             distance_ratios=_rounded(check.ratios))
            return state
    mine = service.contribution
    candidates: list[MemberRecord] = peers.random_peers(stage)[:attempts]
    for peer in candidates:
        started = time.monotonic()
        request_parts = _snapshot_message(MessageKind.SNAPSHOT_REQUEST, cfg, stage, service.worker_id, mine)
        reply = request(ctx, peer.exchange_addr, request_parts, timeout_s=timeout_s)
        if reply is None:
            service.log.warning("peer_exchange_timeout", peer=peer.worker_id[:8], timeout_s=timeout_s)
            peers.blacklist.fail(peer.worker_id)
            continue
        try:
            decoded = decode_message(reply, expected_run_id=cfg.run.run_id, limits=SNAPSHOT_LIMITS)
            if MessageKind(decoded.header.kind) != MessageKind.SNAPSHOT_REPLY or decoded.header.outer_step < 0:
                raise SnapshotRejected("no_snapshot")
            if decoded.header.outer_step < outer_step - cfg.worker.staleness_outer_steps:
                raise SnapshotRejected("stale")
            snapshot = service.read_snapshot(decoded)
            if snapshot.parts_kind == "slow+momentum":
                raise SnapshotRejected("wrong_parts")
            state = service.peer_state(snapshot)
        except WireReject as reject:
            _reject_peer(service, peers, peer.worker_id, reject.reason.value)
            continue
        except SnapshotRejected as rejected:
            if rejected.reason in ("no_snapshot", "stale"):  # a slow peer, not a bad one
                service.log.info("peer_not_ready", peer=peer.worker_id[:8], outer_step=outer_step,
                                 reason=rejected.reason)
            else:
                _reject_peer(service, peers, peer.worker_id, rejected.reason)
            continue
        check = _distance_check(service, state)
        if not check.ok:
            _reject_peer(service, peers, peer.worker_id, "too_far", ratios=_rounded(check.ratios), via="request")
            continue
        elapsed = time.monotonic() - started
        peers.blacklist.succeed(peer.worker_id)
        service.metrics.exchange_latency.observe(elapsed)
        sent = mine.encoded if mine else None
        service.metrics.exchange_bytes_wire.inc(snapshot.encoded.wire_bytes + (sent.wire_bytes if sent else 0))
        service.metrics.exchange_bytes_raw.inc(snapshot.encoded.raw_bytes + (sent.raw_bytes if sent else 0))
        service.log.info("peer_exchange_done", peer=peer.worker_id[:8], outer_step=outer_step,
                         peer_outer_step=decoded.header.outer_step, via="request", latency_s=round(elapsed, 3),
                         wire_bytes=snapshot.encoded.wire_bytes, raw_bytes=snapshot.encoded.raw_bytes,
                         distance_ratios=_rounded(check.ratios))
        return state
    return None


def bootstrap_from_peer(ctx: zmq.Context, donor: MemberRecord, service: SnapshotService, *, timeout_s: float,
                        observer: bool = False,
                        ) -> tuple[list[torch.Tensor], list[torch.Tensor], dict[str, int], str] | None:
    """(slow, momentum, counters, checksum) downloaded from `donor`, or None if it failed.
    observer=True: a read-only pull by the coordinator (the donor does not log it)."""
    cfg = service.cfg
    header = Header(version=PROTOCOL_VERSION, run_id=cfg.run.run_id, kind=MessageKind.BOOTSTRAP_REQUEST,
                    sender=service.worker_id, microbatch_id=0, attempt=0, outer_step=0, stage=service.stage,
                    codec="raw", tensors=[], extra={"observer": True} if observer else {})
    reply = request(ctx, donor.exchange_addr, encode_message(header, []), timeout_s=timeout_s)
    if reply is None:
        service.log.warning("bootstrap_timeout", donor=donor.worker_id[:8], timeout_s=timeout_s)
        return None
    try:
        decoded = decode_message(reply, expected_run_id=cfg.run.run_id, limits=SNAPSHOT_LIMITS)
        if MessageKind(decoded.header.kind) != MessageKind.BOOTSTRAP_REPLY:
            raise SnapshotRejected("no_snapshot")
        snapshot = service.read_snapshot(decoded)
        if snapshot.parts_kind != "slow+momentum":
            raise SnapshotRejected("wrong_parts")
        tensors = service.tensors_of(snapshot)
    except WireReject as reject:
        service.count_reject(reject.reason)
        return None
    except SnapshotRejected as rejected:
        service.count_reject(rejected.reason)
        return None
    half = len(tensors) // 2
    counters = {"inner_steps": snapshot.counters.get("inner_steps", 0),
                "outer_steps": snapshot.counters.get("outer_steps", 0)}
    return tensors[:half], tensors[half:], counters, snapshot.digest
