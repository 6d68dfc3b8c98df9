"""The outer exchange off the training thread (docs/architecture.md §4): push ours, collect theirs.

The training thread hands a round (outer step k, our step-k state, our computed group
partners) to the exchanger and goes on. The exchanger's thread compresses our snapshot
once, pushes it to every partner at once (each push is acknowledged once the partner
validated and kept it), and waits for the partners' own step-k pushes, which the
exchange server's thread keeps in the inbox. A partner's state is used only when its
push arrived and ours to it was acknowledged, so both sides of a pair use each other's
(the replicas' mean is kept) or neither does. When that acknowledgement is lost (a
partition, a stopped process), we ask the partner, saying we kept its push, and do as it
decided (workers/outer/verdicts.py). A round the training thread gives up as late
is closed: pushes for it are refused from then on (their senders then drop their side too),
and a partner whose push was kept before is still settled by our push's acknowledgement.
The round ends when every partner is settled, or after the collection window.

Everything here is host tensors (workers/outer/device_boundary.py): the round's first act
is to wait for our contribution's copy to the host, its last to compute the correction the
training thread will copy back to the device. A round that raises is counted as failed
(kind "failed", by exception type), never passed off as a local step.

With worker.delta_codec, rounds that are not a multiple of worker.theta_every send Δ alone,
sparse (x̂, which the training thread computed and stepped with already:
noloco_rt/outer/delta_exchange.py).
"""

from __future__ import annotations

import math
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
import zmq

from noloco_rt.logs import EventLog
from noloco_rt.net.wire import MessageKind
from noloco_rt.outer.chunks import ChunkAssembly, Piece
from noloco_rt.outer.codec import is_lossless
from noloco_rt.outer.codecs.quantized import QuantizedTensor
from noloco_rt.outer.correction import correction_term, pair_group_size
from noloco_rt.outer.formula import OuterCoefficients, PeerOuterState, TensorList
from noloco_rt.outer.peer_checks import check_peer_distance
from noloco_rt.outer.snapshot import (
    Snapshot,
    SnapshotRejected,
    contribution_parts,
    contribution_state,
)
from workers.faults.snapshot import snapshot_faults_on
from workers.outer.confirm import acknowledged, ask_partner, tell_partners
from workers.outer.device_boundary import HostContribution
from workers.outer.inbox import KeptPush
from workers.outer.partners import Partner, ReadinessPairing
from workers.outer.pusher import ChunkFeed, EncodedChunk, PushRefused, push_stream, start_encoding
from workers.outer.service import SnapshotService
from workers.outer.verdicts import Verdict

TELL_TIMEOUT_S = 0.5
"""How long a finishing or leaving worker gives its last round's partners to take its word."""


@dataclass(frozen=True)
class OuterRound:
    outer_step: int
    own: HostContribution
    """Our state at step k (before the step), on its way to the host: what we push, what
    partners' are checked against, and the base of the correction."""
    partners: list[Partner]
    """Our seeded group; with readiness pairing, the fallback when Redis is away."""
    coeffs: OuterCoefficients
    """α, β, γ: the exchanger computes the correction on the host."""
    by_readiness: bool = False
    window_s: float = 0.0
    """By readiness: how long we wait in the queue for a partner."""
    sparse: bool = False
    """A round of worker.delta_codec: `own` holds φ and x̂; x̂ is sent sparse and averaged
    alone, φ only scales the peer check (noloco_rt/outer/delta_exchange.py)."""


@dataclass
class RoundResult:
    outer_step: int
    partners: list[str] = field(default_factory=list)
    """The group as the round settled it (by readiness: the partner found, if any)."""
    pairing: str = "seeded"
    group_size: int = 0
    """The group as we computed it, us included (what our pushes said)."""
    states: list[PeerOuterState] = field(default_factory=list)
    used: list[str] = field(default_factory=list)
    """Partners whose state is in `states`."""
    pair_sizes: list[int] = field(default_factory=list)
    """|G|_ij of each partner used, as `states` (the larger of the two sides' group sizes)."""
    missing: dict[str, str] = field(default_factory=dict)
    """Partner id -> why its state is not used (no_push, push_failed, unconfirmed, too_far,
    cancelled)."""
    wire_bytes: int = 0
    """Snapshot bytes both ways with the partners used."""
    raw_bytes: int = 0
    sent_wire_bytes: int = 0
    """Our snapshot's size on the wire (what each push carries)."""
    sent_raw_bytes: int = 0
    seconds: float = 0.0
    correction: TensorList | None = None
    """c on the host (pinned on CUDA), when some partner's state was used."""
    correction_sums: tuple[float, float] | None = None
    """(Σ c, Σ |c|) in float64: over a matched group the c sum to 0 (the mean is kept)."""
    failed: str | None = None
    """The exception type that ended the round, if one did (the step stays local)."""
    phases: dict[str, float] = field(default_factory=dict)
    """Seconds from the round's start to the end of each phase: our copy on the host (`host`),
    the partners' pushes here or the window over (`collected`), our chunks all encoded
    (`encoded`), the correction computed (`corrected`): where a slow round spends its time."""


class OuterExchanger:
    """One background thread running rounds one after the other; results by outer step."""

    def __init__(self, ctx: zmq.Context, service: SnapshotService, peers: Any, *, collect_s: float,
                 log: EventLog, readiness: ReadinessPairing | None = None) -> None:
        self.ctx = ctx
        self.service = service
        self.peers = peers
        self.collect_s = collect_s
        self.log = log
        self.readiness = readiness
        self._wake = threading.Event()
        self._rounds: queue.Queue[OuterRound | None] = queue.Queue()
        self._results: dict[int, RoundResult] = {}
        self._done = threading.Condition()
        self._cancelled: set[int] = set()
        self._pushers = ThreadPoolExecutor(max_workers=4, thread_name_prefix="outer-push")
        self._encoders = ThreadPoolExecutor(max_workers=service.cfg.worker.snapshot_encode_threads,
                                            thread_name_prefix="outer-encode")
        self._last_round: tuple[int, list[Partner]] | None = None
        """Our latest round's step and partners: told our decisions when we finish or leave."""
        self._thread = threading.Thread(target=self._run, name="outer-exchanger", daemon=True)
        self._thread.start()

    # -- training thread ----------------------------------------------------------------------

    def begin(self, outer_round: OuterRound) -> None:
        """Start a round; never blocks."""
        self._rounds.put(outer_round)

    def result(self, outer_step: int, *, wait_s: float = 0.0) -> RoundResult | None:
        """The round's result once it ended (removed), waiting up to wait_s; else None.
        Results of earlier rounds nobody asked for any more (dropped late) are discarded."""
        with self._done:
            self._done.wait_for(lambda: outer_step in self._results, timeout=wait_s)
            for stale in [k for k in self._results if k < outer_step]:
                del self._results[stale]
            return self._results.pop(outer_step, None)

    def round_over(self, outer_step: int, *, wait_s: float = 0.0) -> bool:
        """Whether the round has ended with its result not yet taken, waiting up to wait_s
        (the result stays for `result` to take)."""
        with self._done:
            return self._done.wait_for(lambda: outer_step in self._results, timeout=wait_s)

    @property
    def thread(self) -> threading.Thread:
        """The thread that runs the rounds (their pushes, collection and correction)."""
        return self._thread

    def give_up(self, outer_step: int) -> set[str]:
        """Give the round up as late: stop waiting for partners whose push is not here, and
        refuse their pushes from now on, so that they give up their side too (a push not
        acknowledged is never used). Returns the partners whose pushes were kept already: each
        may use ours, so the round still settles them (theirs used exactly when ours was
        acknowledged) and its result must be applied, not dropped."""
        committed = self.service.inbox.close(outer_step)
        with self._done:
            self._cancelled.add(outer_step)
        self._wake.set()
        self.service.inbox.wake()
        return committed

    def tell_last_round(self, *, timeout_s: float = TELL_TIMEOUT_S) -> int:
        """We finish or leave: tell the partners of our latest round what we decided on their
        pushes, unasked, since we will not be there to answer a question (confirm.py). How
        many took it."""
        if (last := self._last_round) is None:
            return 0
        step, partners = last
        told = tell_partners(self.ctx, self.service, step, partners, timeout_s=timeout_s, pool=self._pushers)
        self.log.info("outer_round_told", outer_step=step, partners=len(partners), told=told)
        return told

    def close(self) -> None:
        self._rounds.put(None)
        self._wake.set()
        self.service.inbox.wake()
        self._thread.join(timeout=self.collect_s + 2.0)
        self._pushers.shutdown(wait=False, cancel_futures=True)
        self._encoders.shutdown(wait=False, cancel_futures=True)

    # -- exchanger thread ---------------------------------------------------------------------

    def _run(self) -> None:
        while (outer_round := self._rounds.get()) is not None:
            try:
                result = self._exchange(outer_round)
            except Exception as exc:  # the thread must outlive one bad round: the step stays local, counted as failed
                self.log.error("outer_round_failed", outer_step=outer_round.outer_step, error=repr(exc), exc_info=exc)
                result = RoundResult(outer_round.outer_step, partners=[p.worker_id for p in outer_round.partners],
                                     missing={p.worker_id: "failed" for p in outer_round.partners},
                                     failed=type(exc).__name__)
            self.service.inbox.advance(outer_round.outer_step + 1)  # later pushes for it are refused
            self.service.verdicts.round_over(outer_round.outer_step)
            with self._done:
                self._cancelled.discard(outer_round.outer_step)
                self._results[outer_round.outer_step] = result
                self._done.notify_all()
            self._wake.clear()

    def _exchange(self, outer_round: OuterRound) -> RoundResult:
        started = time.monotonic()
        step = outer_round.outer_step
        if self._is_cancelled(step):  # given up before it began (a backlog): push nothing, use nothing
            return RoundResult(step, partners=[p.worker_id for p in outer_round.partners],
                               missing={p.worker_id: "cancelled" for p in outer_round.partners})
        own = outer_round.own.state()  # our contribution on the host: the one device -> host crossing
        quantized = outer_round.own.quantized()  # quantised on the device already: the host packs its codes
        phases = {"host": time.monotonic() - started}
        scale = None  # a sparse round: x̂ alone is sent, our φ scales the peer check
        if outer_round.sparse:
            if own.slow is None or own.outer_grad is None:
                raise ValueError("a sparse round needs our slow weights and what we sent")
            own, scale = PeerOuterState(outer_grad=own.outer_grad), own.slow
        feed = self._start_encoding(step, own, quantized)  # before any waiting: chunks ready to push
        partners, pairing = self._partners(outer_round)
        group_size = len(partners) + 1  # as we computed it: each push says so (a pair's weight)
        pushes = {p.worker_id: self._pushers.submit(self._push, p, feed, group_size) for p in partners}
        for push in pushes.values():  # the waits below re-check when a push settles, not at their next poll
            push.add_done_callback(self._push_settled)
        ids = list(pushes)
        self.service.inbox.wait_for(
            step, ids, timeout_s=self.collect_s,
            stop=lambda here: self._is_cancelled(step) or _all_settled(pushes, here))
        phases["collected"] = time.monotonic() - started
        if feed.wait_closed(self.collect_s) and feed.error is not None:
            raise feed.error
        phases["encoded"] = (feed.closed_at or time.monotonic()) - started
        wire, raw = feed.bytes()
        result = RoundResult(step, partners=ids, pairing=pairing, sent_wire_bytes=wire, sent_raw_bytes=raw,
                             group_size=group_size, phases=phases)
        unsure = []
        for partner in partners:  # the sure ones first: an unsure partner may be asking for our word on them
            partner_id = partner.worker_id
            here = self.service.inbox.here_or_refused(step, partner_id)  # now, not at the window's end
            acked = (acknowledged(self.service.verdicts, partner_id, step, pushes[partner_id], wait_s=self.collect_s)
                     if here else False)
            if acked is None:
                unsure.append(partner)
            else:
                self._decide(result, partner_id, acked, "push_failed" if here else "no_push",
                             own=own, scale=scale)
        for partner in unsure:  # used exactly when it uses ours; declined, or no answer at all, is a local step
            verdict = ask_partner(self.ctx, self.service, partner, step, window_s=self.collect_s, log=self.log)
            self._decide(result, partner.worker_id, verdict is Verdict.USED,
                         "unconfirmed" if verdict is None else "push_failed", own=own, scale=scale)
        if result.states:
            if self._symmetric(outer_round) and quantized is None:  # ours as partners decoded it (quantised
                own = self._as_sent(feed, own)                       # on the device: `own` is that already)
            # Each pair over the larger computed group size: a partial group's pairs, and a pair
            # whose views of the stage differ, still cancel (correction.py).
            correction = correction_term(own, result.states, outer_round.coeffs, group_size=result.pair_sizes)
            result.correction_sums = correction_sums(correction)
            result.correction = self.service.boundary.ready_for_device(correction)
            phases["corrected"] = time.monotonic() - started
        result.seconds = time.monotonic() - started
        self._last_round = (step, partners)
        return result

    def _symmetric(self, outer_round: OuterRound) -> bool:
        """A lossy codec: we average with our contribution as partners decoded it, so that a
        pair's corrections are equal and opposite (the replicas' mean kept exactly). Not when
        a test injects faults into what we send: we would take our own poisoned copy."""
        worker = self.service.cfg.worker
        lossy = outer_round.sparse or not is_lossless(worker.snapshot_codec)
        return lossy and not snapshot_faults_on(self.service.cfg)

    def _as_sent(self, feed: ChunkFeed, own: PeerOuterState) -> PeerOuterState:
        """Our contribution decoded from the chunks we pushed (all encoded: partners used them)."""
        parts_kind = contribution_parts(own)[1]
        assembly = ChunkAssembly(self.service.reader.expected_shapes * parts_kind.copies, feed.total)
        for chunk in feed.chunks:
            assembly.add(chunk.index, chunk.pieces, self.service.reader.tensors(chunk.snapshot))
        return contribution_state(assembly.tensors(), parts_kind)

    def _start_encoding(self, step: int, own: PeerOuterState, quantized: list[QuantizedTensor] | None) -> ChunkFeed:
        """Our contribution's chunks, compressing in the background into a feed the pushers read
        (from the codes when it was quantised on the device)."""
        parts, parts_kind, plan = self.service.plan_contribution(own)
        feed = ChunkFeed(total=len(plan))
        if quantized is not None:
            def encode(pieces: list[Piece]) -> Snapshot:
                return self.service.encode_quantized_chunk(quantized, pieces, step, parts_kind)
        else:
            def encode(pieces: list[Piece]) -> Snapshot:
                return self.service.encode_chunk(parts, pieces, step, parts_kind)
        start_encoding(feed, encode, plan, self._encoders)
        return feed

    def _partners(self, outer_round: OuterRound) -> tuple[list[Partner], str]:
        if not outer_round.by_readiness or self.readiness is None:
            return outer_round.partners, "seeded"
        step = outer_round.outer_step
        return self.readiness.find(step, window_s=outer_round.window_s, fallback=outer_round.partners,
                                   cancelled=lambda: self._is_cancelled(step), wake=self._wake)

    def _is_cancelled(self, outer_step: int) -> bool:
        with self._done:
            return outer_step in self._cancelled

    def _decide(self, result: RoundResult, partner_id: str, acked: bool, why_not: str, *,
                own: PeerOuterState, scale: list[torch.Tensor] | None) -> None:
        """Use the partner's state or not, and record it: an unsure partner asks for exactly this."""
        step = result.outer_step
        why = why_not if not acked else None
        if why is None:
            taken = self.service.inbox.take(step, partner_id)
            why = "no_push" if taken is None else self._use(result, partner_id, taken, own=own, scale=scale)
        self.service.verdicts.decide(partner_id, step, why is None)
        if why is not None:
            result.missing[partner_id] = why

    def _use(self, result: RoundResult, partner_id: str, taken: KeptPush, *,
             own: PeerOuterState, scale: list[torch.Tensor] | None = None) -> str | None:
        theirs, state = taken.snapshot, taken.state
        max_ratio = self.service.cfg.worker.max_peer_distance_ratio
        check = check_peer_distance(state, own, max_ratio=max_ratio, scale=scale)
        if not check.ok:
            self.service.count_reject("too_far")
            avoid_s = self.peers.blacklist.fail(partner_id)
            self.log.warning("peer_snapshot_rejected", peer=partner_id[:8], reason="too_far",
                             blacklisted_s=avoid_s, ratios=_rounded(check.ratios))
            return "too_far"
        self.peers.blacklist.succeed(partner_id)
        self.log.info("peer_exchange_done", peer=partner_id[:8], outer_step=result.outer_step,
                      peer_outer_step=theirs.outer_step, wire_bytes=theirs.encoded.wire_bytes,
                      raw_bytes=theirs.encoded.raw_bytes, distance_ratios=_rounded(check.ratios))
        result.states.append(state)
        result.used.append(partner_id)
        result.pair_sizes.append(pair_group_size(result.group_size, taken.group_size))
        result.wire_bytes += theirs.encoded.wire_bytes + result.sent_wire_bytes
        result.raw_bytes += theirs.encoded.raw_bytes + result.sent_raw_bytes
        return None

    def _push(self, partner: Partner, feed: ChunkFeed, group_size: int) -> bool | None:
        """Our snapshot streamed to one partner: True once it acknowledged (validated and
        placed) every chunk, False when it refused one (it did not keep ours), None when the
        stream stalled (it may have kept ours and its acknowledgement be lost)."""
        def message(chunk: EncodedChunk) -> list[Any]:
            return self.service.chunk_push_message(chunk.snapshot, chunk.index, feed.total, chunk.pieces,
                                                   partner.outer_step, group_size)
        try:
            acked = push_stream(self.ctx, partner.exchange_addr, feed, message, self._is_ack, stall_s=self.collect_s)
        except PushRefused:
            self.log.info("snapshot_push_refused", peer=partner.worker_id[:8])
            return False
        if not acked and feed.error is None:
            avoid_s = self.peers.blacklist.fail(partner.worker_id)
            self.log.warning("snapshot_push_timeout", peer=partner.worker_id[:8], timeout_s=self.collect_s,
                             blacklisted_s=avoid_s)
        return True if acked else None

    def _push_settled(self, _push: Future[bool | None]) -> None:
        """A push was acknowledged, refused or stalled: what the round waits on may be complete
        (without this, each wait noticed it at its 50-ms poll: most of a fast round's time)."""
        self.service.inbox.wake()
        self.service.verdicts.wake()

    def _is_ack(self, reply: list[zmq.Frame]) -> bool:
        try:
            return MessageKind(self.service.reader.message(reply).header.kind) == MessageKind.SNAPSHOT_ACK
        except (SnapshotRejected, ValueError):
            return False


def correction_sums(correction: list[torch.Tensor]) -> tuple[float, float]:
    """(Σ c, Σ |c|) over every element, accumulated in float64 without float64 copies of c (on a
    GPU-sized stage the copies took over a second of the round, past the correction's deadline)."""
    return (float(sum(c.sum(dtype=torch.float64) for c in correction)),
            float(sum(c.abs().sum(dtype=torch.float64) for c in correction)))


def _all_settled(pushes: dict[str, Future[bool | None]], here: set[str]) -> bool:
    """Nothing more can change the round: each partner's push is here or ours to it failed."""
    return all(pid in here or (f.done() and (f.exception() is not None or not f.result()))
               for pid, f in pushes.items())


def _rounded(ratios: dict[str, float]) -> dict[str, float]:
    return {k: float(f"{v:.4g}") if math.isfinite(v) else v for k, v in ratios.items()}
