"""Sending forwards to the next stage, and getting every one back or accounted for (docs/architecture.md §3).

Each forward goes to a live next-stage worker (the routing policy decides which) and stays
in flight until its gradient returns; the round trip, or the time owed by a forward given
up, feeds the routing's view of that worker. A forward whose send fails or whose deadline passes
is re-sent with a new attempt id to a worker that has not failed it yet, or, when every
live worker has been tried, waits on the attempts already out, twice as long each time; the
first reply of any attempt resolves it (a given-up peer was often only slow: a
downstream worker in a blocking outer step). After worker.max_retries + 1 deadlines it
is dropped and counted. Deadlines derive from observed round trips, late replies
included, so they grow to cover the stalls this pipeline really has.

Sends never wait: the data link (noloco_rt/net/data_link.py) sends on its own thread and
reports a send that no connection took in time back to this thread, which then treats it
as a failed attempt.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import torch

from noloco_rt.membership.records import MemberRecord
from noloco_rt.net import messages
from workers.data_path.context import DataContext
from workers.data_path.deadlines import DeadlinePolicy, LatencyTracker
from workers.data_path.deal import DealPosition
from workers.data_path.inflight import InflightEntry, InflightTable


def deadline_policy(floor_s: float, ceiling_s: float) -> DeadlinePolicy:
    """The configured bounds; before any round trip is seen, 10 s within them (start-up includes warm-up)."""
    return DeadlinePolicy(floor_s=floor_s, ceiling_s=ceiling_s, initial_s=min(max(10.0, floor_s), ceiling_s))


class Downstream:
    """The microbatches this worker has in flight at the next stage."""

    def __init__(self, ctx: DataContext, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.ctx = ctx
        self.next_stage = ctx.stage + 1
        self.clock = clock
        self.inflight = InflightTable()
        self.latency = LatencyTracker(deadline_policy(ctx.cfg.worker.deadline_floor_s,
                                                      ctx.cfg.worker.deadline_ceiling_s))
        self._microbatch_ids = itertools.count()
        self._deal = DealPosition(seed=ctx.cfg.run.seed, stage=ctx.stage, per_sender=ctx.budget,
                                  rank=lambda: ctx.peers.rank(ctx.stage))
        self._far_logged: frozenset[str] = frozenset()

    def __len__(self) -> int:
        return len(self.inflight)

    def choose(self, origin_step: int | None = None, *, exclude: set[str] | None = None) -> MemberRecord | None:
        """A live next-stage worker by the routing policy, or None if there is none. Balanced,
        a first attempt takes the next slot of its origin step's deal (routing/balanced.py);
        a re-send (`exclude`), or data without an origin step, the load-aware choice."""
        ctx = self.ctx
        policy = ctx.cfg.routing.policy
        if policy != "balanced" or exclude or origin_step is None:
            return ctx.peers.choose_next_hop(self.next_stage, "p2c" if policy == "balanced" else policy,
                                             exclude=exclude)
        peer, passed_over = ctx.peers.deal_next_hop(self.next_stage, self._deal.slot(origin_step),
                                                    site=ctx.cfg.worker.site, far_share=ctx.cfg.routing.far_share,
                                                    measured=ctx.cfg.routing.locality == "auto")
        if peer is not None:
            self._deal.taken(origin_step)
            ctx.counters.route_passed_over += passed_over
        if ctx.peers.far_ids != self._far_logged:  # a user sees where the pipeline stays
            self._far_logged = ctx.peers.far_ids
            far = sorted(p[:8] for p in self._far_logged)
            ctx.log.info("far_peers", next_stage=self.next_stage, far=far,
                         sent_before={p: ctx.counters.routed_to[p] for p in far},
                         links_ms={p[:8]: round(1000 * best, 2) for p in ctx.peers.links.peers()
                                   if (best := ctx.peers.links.best(p)) is not None})
        return peer

    def forward(self, output: torch.Tensor, targets: torch.Tensor, context: Any, peer: MemberRecord | None, *,
                origin_step: int | None = None) -> None:
        """Send `output` (B, T, C) and `targets` (B, T) to `peer` (or, failing that, to another
        worker) and keep `context` until the gradient comes back; `origin_step`: the stage-0
        inner step of this data (see messages.forward)."""
        ctx = self.ctx
        mb_id = next(self._microbatch_ids)
        host = ctx.to_wire(output)
        frames = messages.forward(ctx.cfg.run.run_id, ctx.worker_id, ctx.stage, mb_id, ctx.data.address,
                                  host.tensors, targets, origin_step=origin_step, ready=host.ready)
        self.inflight.add(mb_id, peer=peer.worker_id if peer else "", now=self.clock(),
                          deadline_s=self.latency.deadline_s(), payload=frames, context=context)
        ctx.counters.sent += 1
        ctx.tokens.add(targets.numel())
        if peer is None:
            self.inflight.get(mb_id).unsent.add(0)
            self.resend(mb_id)
        else:
            self._send(peer, frames, mb_id, attempt=0)

    def _send(self, peer: MemberRecord, message: messages.Outgoing, mb_id: int, *, attempt: int) -> None:
        ctx = self.ctx
        ctx.data.send(peer.data_addr, message.parts(), ready=message.ready,
                      on_failure=lambda: self._send_failed(peer, mb_id, attempt))
        ctx.counters.routed_to[peer.worker_id[:8]] += 1
        ctx.peers.sent_to(peer.worker_id)
        ctx.metrics.forwarded.inc()

    def _send_failed(self, peer: MemberRecord, mb_id: int, attempt: int) -> None:
        """No connection to `peer` took the attempt in time (reported by the data link): the peer
        is blacklisted and the microbatch, if this is still its live attempt, goes elsewhere."""
        ctx = self.ctx
        ctx.log.warning("send_failed", peer=peer.worker_id[:8], microbatch=mb_id)
        ctx.peers.blacklist.fail(peer.worker_id)
        ctx.peers.returned_from(peer.worker_id)  # it never went: nothing to learn, the load is released
        entry = self.inflight.get(mb_id)
        if entry is not None:
            entry.unsent.add(attempt)
            if entry.attempt == attempt:
                self.resend(mb_id)

    def resend(self, mb_id: int) -> None:
        """Re-send microbatch mb_id (new attempt id) to a live worker that has not failed it
        yet, or, with none left, wait (on the attempts out, or for a worker to appear); drop
        it once max_retries + 1 deadlines have passed. The failed attempt's peer has already
        been released (see _give_up, _send_failed)."""
        entry = self.inflight.get(mb_id)
        if entry is None:
            return
        ctx = self.ctx
        deadlines_left = entry.attempt + entry.waits < ctx.cfg.worker.max_retries
        peer = self.choose(exclude=set(entry.tried)) if deadlines_left else None
        if peer is None and deadlines_left:
            policy = self.latency.policy
            if entry.any_out():
                # Every live peer has it (or had it): wait on those attempts rather than lose it, twice
                # as long each time (a stall outlasts a deadline learnt from quiet round trips).
                wait_s = min(policy.ceiling_s, self.latency.deadline_s() * 2 ** (entry.waits + 1))
            else:
                # Nothing went out and no untried worker is live (the view is still empty at
                # start-up, or every send failed): look again soon for one to appear.
                wait_s = min(policy.ceiling_s, policy.floor_s * 2 ** entry.waits)
                ctx.peers.refresh_soon()
            self.inflight.wait_again(mb_id, now=self.clock(), deadline_s=wait_s)
            ctx.log.info("microbatch_waiting", microbatch=mb_id, attempts=entry.attempt + 1, waits=entry.waits,
                         out=entry.any_out())
            return
        if peer is not None:
            self.inflight.retry(mb_id, peer=peer.worker_id, now=self.clock(), deadline_s=self.latency.deadline_s())
            entry.payload = messages.with_attempt(entry.payload, entry.attempt)
            ctx.counters.retried += 1
            ctx.metrics.retried.inc()
            ctx.log.info("microbatch_retried", microbatch=mb_id, attempt=entry.attempt, peer=peer.worker_id[:8])
            self._send(peer, entry.payload, mb_id, attempt=entry.attempt)
            return
        self.inflight.abandon(mb_id)
        ctx.drop(mb_id, "retries_exhausted")

    def resolve(self, microbatch_id: int, attempt: int, *, received_at: float | None = None,
                held_s: float | None = None) -> InflightEntry | None:
        """The entry a gradient answers (its peer credited), or None for a late or duplicate
        reply. With when our link took the gradient (`received_at`) and how long the peer held
        the forward (`held_s`), the peer's link round trip is learnt too (routing/locality.py)."""
        entry = self.inflight.resolve(microbatch_id, attempt)
        if entry is None:
            return None
        now = self.clock()
        self.latency.observe(entry.round_trip_s(now))  # deadlines: the whole wait, ours included
        # The peer's round trip ends where our link took its reply: a reply that then waited
        # for our training thread (our first step held the first ones ~240 ms) is not the
        # peer's slowness, and routing would pass it over for a second or more.
        peer_rtt_s = entry.round_trip_s(now if received_at is None else min(now, received_at))
        peers = self.ctx.peers
        if received_at is not None and held_s is not None:
            peers.link_measured(entry.answered_by, entry.round_trip_s(received_at), held_s)
        if entry.answered == entry.attempt and not entry.released():
            peers.blacklist.succeed(entry.peer)
            peers.returned_from(entry.peer, peer_rtt_s)
        else:  # an attempt given up on answered: its peer is slow, not gone; the live one's is released
            peers.answered_late(entry.answered_by, peer_rtt_s)
            if not entry.released():
                peers.returned_from(entry.peer)
            self.ctx.counters.answered_late += 1
        return entry

    def retry_expired(self) -> None:
        """Microbatches past their deadline: their peer is blacklisted, they go elsewhere."""
        for entry in self.inflight.expired(self.clock()):
            self._give_up(entry)
            self.resend(entry.microbatch_id)

    def drop_expired(self, reason: str, *, now: float | None = None) -> None:
        """Microbatches past their deadline (at `now`; default: the clock) are given up."""
        for entry in self.inflight.expired(self.clock() if now is None else now):
            self._give_up(entry)
            self.inflight.abandon(entry.microbatch_id)
            self.ctx.drop(entry.microbatch_id, reason)

    def _give_up(self, entry: InflightEntry) -> None:
        """Stop waiting on the entry's current attempt (its send succeeded: entries whose send
        failed were re-sent or dropped at once). Its peer is blacklisted and, if the deadline
        really passed, the time owed counts as a round trip, so a silent peer looks slow;
        forced early (leaving), nothing is learnt."""
        if entry.released():
            return  # it never left, or was given up on already (we are waiting on it)
        entry.given_up = entry.attempt
        now = self.clock()
        self.ctx.peers.blacklist.fail(entry.peer)
        self.ctx.peers.returned_from(entry.peer, now - entry.sent_at if now >= entry.deadline_at else None)
