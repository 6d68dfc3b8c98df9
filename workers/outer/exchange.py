"""The client side of the outer exchange: our group partners' contributions for our outer step.

Workers compute their groups from the same stage view (noloco_rt.algo.matching), so
partners choose each other. For each partner a worker first looks in its inbox for the
snapshot that partner sent for this very step (it asked us first); else it sends its own
snapshot to the partner and gets the partner's back in the same round trip. (The random
single-peer exchange, exchange_with_peer, remains for benchmarks/sync.) A reply older
than worker.staleness_outer_steps, or no snapshot yet, marks a slow peer, not a bad one.
Every used contribution must also lie within worker.max_peer_distance_ratio of ours
(noloco_rt.algo.peer_checks): a finite, well-formed snapshot absurdly far from our weights
is rejected as "too_far" and its sender blacklisted.
"""

from __future__ import annotations

import math
import time
from typing import Any

import zmq

from noloco_rt.algo.optim import PeerOuterState
from noloco_rt.algo.peer_checks import PeerCheck, check_peer_distance
from noloco_rt.membership.records import MemberRecord
from noloco_rt.net.snapshot import Snapshot, SnapshotRejected, require_kind, snapshot_message
from noloco_rt.net.transport import request
from noloco_rt.net.wire import MessageKind
from workers.outer.service import SnapshotService

NOT_READY_REASONS = ("no_snapshot", "stale")
"""A peer that has no usable snapshot yet is slow, not bad: it is not blacklisted."""


def exchange_with_peer(ctx: zmq.Context, peers: Any, stage: int, service: SnapshotService, outer_step: int, *,
                       attempts: int, timeout_s: float) -> PeerOuterState | None:
    """The group partner's state for this outer step, or None (then the step is local)."""
    state = _from_inbox(peers, service, outer_step)
    if state is not None:
        return state
    candidates: list[MemberRecord] = peers.random_peers(stage)[:attempts]
    for peer in candidates:
        state = _ask_peer(ctx, peers, service, peer, outer_step, timeout_s=timeout_s)
        if state is not None:
            return state
    return None


def exchange_with_group(ctx: zmq.Context, peers: Any, service: SnapshotService, outer_step: int,
                        partners: list[MemberRecord], *, timeout_s: float) -> list[PeerOuterState]:
    """The states of our computed group partners for this outer step, each from the inbox (it
    asked us first) or by asking it; a partner that does not answer, or is blacklisted, is
    left out (the step is then partial or local). No one outside the group is asked."""
    states = []
    for partner in partners:
        state = _from_inbox(peers, service, outer_step, sender=partner.worker_id)
        if state is None and not peers.blacklist.blocked(partner.worker_id):
            state = _ask_peer(ctx, peers, service, partner, outer_step, timeout_s=timeout_s)
        if state is not None:
            states.append(state)
    return states


def _from_inbox(peers: Any, service: SnapshotService, outer_step: int,
                sender: str | None = None) -> PeerOuterState | None:
    """A partner's contribution that came with its own request, if close enough to ours."""
    taken = service.take_inbox(outer_step, sender)
    if taken is None:
        return None
    sender, snapshot, state = taken  # validated when it arrived
    check = _distance_check(service, state)
    if not check.ok:
        _reject_peer(service, peers, sender, "too_far", ratios=_rounded(check.ratios), via="inbox")
        return None
    service.log.info("peer_exchange_done", peer=sender[:8], outer_step=outer_step, via="inbox",
                     wire_bytes=snapshot.encoded.wire_bytes, raw_bytes=snapshot.encoded.raw_bytes,
                     distance_ratios=_rounded(check.ratios))
    return state


def _ask_peer(ctx: zmq.Context, peers: Any, service: SnapshotService, peer: MemberRecord, outer_step: int, *,
              timeout_s: float) -> PeerOuterState | None:
    """One round trip with `peer`: our snapshot out, theirs back, validated; None if unusable."""
    started = time.monotonic()
    mine = service.contribution
    frames = snapshot_message(MessageKind.SNAPSHOT_REQUEST, run_id=service.cfg.run.run_id, stage=service.stage,
                              sender=service.worker_id, snapshot=mine)
    reply = request(ctx, peer.exchange_addr, frames, timeout_s=timeout_s)
    if reply is None:
        service.log.warning("peer_exchange_timeout", peer=peer.worker_id[:8], timeout_s=timeout_s)
        peers.blacklist.fail(peer.worker_id)
        return None
    try:
        peer_step, snapshot, state = _read_reply(service, reply, outer_step)
    except SnapshotRejected as rejected:
        if rejected.reason in NOT_READY_REASONS:
            service.log.info("peer_not_ready", peer=peer.worker_id[:8], outer_step=outer_step,
                             reason=rejected.reason)
        else:
            _reject_peer(service, peers, peer.worker_id, rejected.reason)
        return None
    check = _distance_check(service, state)
    if not check.ok:
        _reject_peer(service, peers, peer.worker_id, "too_far", ratios=_rounded(check.ratios), via="request")
        return None
    elapsed = time.monotonic() - started
    peers.blacklist.succeed(peer.worker_id)
    _count_bytes(service, elapsed, received=snapshot, sent=mine)
    service.log.info("peer_exchange_done", peer=peer.worker_id[:8], outer_step=outer_step,
                     peer_outer_step=peer_step, via="request", latency_s=round(elapsed, 3),
                     wire_bytes=snapshot.encoded.wire_bytes, raw_bytes=snapshot.encoded.raw_bytes,
                     distance_ratios=_rounded(check.ratios))
    return state


def _read_reply(service: SnapshotService, reply: list[Any], outer_step: int,
                ) -> tuple[int, Snapshot, PeerOuterState]:
    """(the peer's outer step, its snapshot, its state) from a reply; raises SnapshotRejected."""
    decoded = service.reader.message(reply)
    require_kind(decoded, MessageKind.SNAPSHOT_REPLY)
    peer_step = decoded.header.outer_step
    if peer_step < 0:
        raise SnapshotRejected("no_snapshot")
    if peer_step < outer_step - service.cfg.worker.staleness_outer_steps:
        raise SnapshotRejected("stale")
    snapshot, state = service.reader.contribution(decoded)
    return peer_step, snapshot, state


def _count_bytes(service: SnapshotService, elapsed_s: float, *, received: Snapshot, sent: Snapshot | None) -> None:
    metrics = service.metrics
    metrics.exchange_latency.observe(elapsed_s)
    sent_wire, sent_raw = (sent.encoded.wire_bytes, sent.encoded.raw_bytes) if sent else (0, 0)
    metrics.exchange_bytes_wire.inc(received.encoded.wire_bytes + sent_wire)
    metrics.exchange_bytes_raw.inc(received.encoded.raw_bytes + sent_raw)


def _reject_peer(service: SnapshotService, peers: Any, peer_id: str, reason: str, **fields: Any) -> None:
    """Count a bad contribution, blacklist its sender and say so."""
    service.count_reject(reason)
    avoid_s = peers.blacklist.fail(peer_id)
    service.log.warning("peer_snapshot_rejected", peer=peer_id[:8], reason=reason, blacklisted_s=avoid_s, **fields)


def _distance_check(service: SnapshotService, state: PeerOuterState) -> PeerCheck:
    """The peer's distance from our own published state (always ok before we published one)."""
    own = service.own_state
    max_ratio = service.cfg.worker.max_peer_distance_ratio
    if own is None:
        return PeerCheck({}, max_ratio)
    return check_peer_distance(state, own, max_ratio=max_ratio)


def _rounded(ratios: dict[str, float]) -> dict[str, float]:
    return {k: float(f"{v:.4g}") if math.isfinite(v) else v for k, v in ratios.items()}
