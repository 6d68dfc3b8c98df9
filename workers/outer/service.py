"""The server side of the outer exchange: pushes received, snapshots for joiners served.

Partners push their outer-step contributions (docs/architecture.md §4); the exchange server's thread
validates each in full (a zstd bomb or NaN payload is refused at once with an ERROR),
keeps it in the inbox for our own step of that number and acknowledges it, so receiving
never touches the training thread. Joiners and the coordinator pull our slow weights,
momentum and counters, copied when someone asks: a request that finds no copy is answered
"preparing" and the training thread copies them at its next inner-step boundary where they
are final (after an overlapped step's correction); while requests keep coming (for
BOOTSTRAP_DEMAND_S after the last), each final outer step copies them at once, and the
first request for a copy compresses it (once per step, on the server thread).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch
import zmq

from noloco_rt.algo.replica import StageReplica
from noloco_rt.config import Config
from noloco_rt.config.choices import LOSSLESS_CODECS
from noloco_rt.logs import EventLog
from noloco_rt.net.header_extra import HeaderExtra
from noloco_rt.net.wire import DecodedMessage, Header, MessageKind
from noloco_rt.outer.chunks import ALIGN, ChunkError, Piece, piece_views, plan_chunks
from noloco_rt.outer.codecs.quantized import QuantizedTensor
from noloco_rt.outer.codecs.sparse import CHUNK as SPARSE_CHUNK
from noloco_rt.outer.device_check import one_device
from noloco_rt.outer.formula import PeerOuterState
from noloco_rt.outer.snapshot import (
    PartsKind,
    Snapshot,
    SnapshotReader,
    SnapshotRejected,
    chunk_message,
    contribution_parts,
    encode_quantized_snapshot,
    encode_snapshot,
    push_group_size,
    push_target_step,
    snapshot_message,
)
from noloco_rt.routing.peers import Blacklist
from workers.device import HostCopy
from workers.faults.snapshot import inject_snapshot_faults
from workers.metrics import RejectCounter, WorkerMetrics
from workers.outer.assembly import PushAssemblies
from workers.outer.device_boundary import ExchangeBoundary
from workers.outer.inbox import SnapshotInbox
from workers.outer.verdicts import PairVerdicts, Verdict

BOOTSTRAP_DEMAND_S = 600.0
"""After a bootstrap request, each final outer step copies φ and δ for this long: a coordinator
pulls every few minutes and joiners come in waves. Past it, the copy is dropped at the next
final step (no host copy, no memory held while nobody joins)."""


class SnapshotService:
    """Encodes this worker's snapshots (exchanger thread), keeps partners' pushes and serves
    joiners (server thread)."""

    def __init__(self, cfg: Config, stage: int, worker_id: str, *, metrics: WorkerMetrics, log: EventLog,
                 expected_shapes: list[tuple[int, ...]], blacklist: Blacklist | None = None,
                 boundary: ExchangeBoundary | None = None) -> None:
        self.cfg = cfg
        self.boundary = boundary or ExchangeBoundary.on("cpu")
        """The exchange's device crossings (the replica's device <-> the host)."""
        self.stage = stage
        self.worker_id = worker_id
        self.metrics = metrics
        self.log = log
        self.reader = SnapshotReader(cfg.run.run_id, expected_shapes)
        fresh_s = max(60.0, 6 * cfg.worker.exchange_timeout_s)  # a push older than this is of no use
        self.inbox = SnapshotInbox(fresh_s=fresh_s)
        self.assemblies = PushAssemblies(expected_shapes, stale_s=fresh_s)
        """Partners' pushes still arriving chunk by chunk (server thread only)."""
        self.verdicts = PairVerdicts()
        """Our rounds' decisions per partner, and partners' word on ours (asked or told)."""
        self.rejected = RejectCounter(metrics.rejected)
        self.blacklist = blacklist or Blacklist()
        """Senders of refused contributions (shared with the worker's peer view)."""
        self._bootstrap_parts: tuple[HostCopy, dict[str, int]] | None = None
        """None, or the copy of φ and δ at our latest final state (never an older one)."""
        self._bootstrap: Snapshot | None = None
        self._bootstrap_lock = threading.Lock()
        self._final: tuple[StageReplica, dict[str, int]] | None = None
        """The replica and the counters of our latest final state (training thread only)."""
        self._bootstrap_wanted = threading.Event()
        """Set by a request that found no copy; the training thread makes one and clears it."""
        self._demand_until = float("-inf")

    def count_reject(self, reason: Any) -> None:
        self.rejected.count(reason)

    @property
    def rejects(self) -> dict[str, int]:
        """Exchange-side rejects so far, by reason."""
        return self.rejected.counts()

    # -- encoding ---------------------------------------------------------------------------

    def plan_contribution(self, state: PeerOuterState) -> tuple[list[torch.Tensor], PartsKind, list[list[Piece]]]:
        """Our contribution's host tensors (fault injection applies here), what they are, and
        the pieces of each chunk they stream in. ValueError for tensors not on the host:
        the exchange crosses to the host once, in the device boundary, not here."""
        parts, parts_kind = contribution_parts(state)
        if (device := one_device(parts, what="plan_contribution")) is not None and device.type != "cpu":
            raise ValueError(f"plan_contribution: our contribution is on {device}, expected host tensors "
                             "(workers/outer/device_boundary.py copies it at the outer step)")
        parts = [t.detach().float().contiguous() for t in inject_snapshot_faults(parts, self.cfg)]
        chunk_elems = max(ALIGN, int(self.cfg.worker.snapshot_chunk_mb * (1 << 20)) // 4)
        align = SPARSE_CHUNK if parts_kind is PartsKind.GRAD else ALIGN
        return parts, parts_kind, plan_chunks([t.numel() for t in parts], chunk_elems, align=align)

    def encode_chunk(self, parts: list[torch.Tensor], pieces: list[Piece], outer_step: int,
                     parts_kind: PartsKind) -> Snapshot:
        """One chunk of our contribution, compressed (any thread: it only reads `parts`): Δ
        alone with worker.delta_codec, a whole state with worker.snapshot_codec."""
        codec = self.cfg.worker.delta_codec if parts_kind is PartsKind.GRAD else self.cfg.worker.snapshot_codec
        return encode_snapshot(piece_views(parts, pieces), codec, outer_step, parts_kind)

    def encode_quantized_chunk(self, quantized: list[QuantizedTensor], pieces: list[Piece], outer_step: int,
                               parts_kind: PartsKind) -> Snapshot:
        """One chunk of our contribution quantised on the device already: its codes packed and
        compressed with worker.snapshot_codec (any thread: it only reads `quantized`)."""
        return encode_quantized_snapshot([quantized[p.tensor].piece(p.start, p.count) for p in pieces],
                                         self.cfg.worker.snapshot_codec, outer_step, parts_kind)

    def chunk_push_message(self, chunk: Snapshot, index: int, total: int, pieces: list[Piece],
                           for_step: int, group_size: int) -> list[Any]:
        """Chunk `index` of `total` of our contribution, for a partner at its outer step
        `for_step`, saying the size of the group we computed (the pair's weight)."""
        return chunk_message(MessageKind.SNAPSHOT_PUSH, run_id=self.cfg.run.run_id, stage=self.stage,
                             sender=self.worker_id, chunk=chunk, index=index, total=total, pieces=pieces,
                             for_step=for_step, group_size=group_size)

    def confirm_message(self, partner_step: int) -> list[Any]:
        """Our question to a partner whose push for its step `partner_step` we kept, when its
        acknowledgement of ours never came: does it use ours? (workers/outer/verdicts.py)"""
        return self._message_at(MessageKind.OUTER_CONFIRM, partner_step, {})

    def state_final(self, replica: StageReplica, inner_steps: int, outer_steps: int) -> None:
        """Training thread: φ and δ are final (start-up, an outer step settled). Copied for
        joiners at once while requests came in the last BOOTSTRAP_DEMAND_S; otherwise only
        noted, and an older copy dropped (it no longer is our state)."""
        self._final = (replica, {"inner_steps": inner_steps, "outer_steps": outer_steps})
        if time.monotonic() < self._demand_until:
            self.publish_bootstrap()
            return
        with self._bootstrap_lock:
            self._bootstrap_parts = None
            self._bootstrap = None

    def bootstrap_asked(self) -> bool:
        """Whether a joiner's request waits for our next copy of φ and δ."""
        return self._bootstrap_wanted.is_set()

    def publish_bootstrap_if_wanted(self) -> None:
        """Training thread, at an inner-step boundary where φ and δ are final: the copy a
        request is waiting for (one Event read when nobody asked)."""
        if self._bootstrap_wanted.is_set():
            self._bootstrap_wanted.clear()
            self.publish_bootstrap()

    def publish_bootstrap(self) -> None:
        """Start copying our latest final slow weights and momentum to the host for joiners
        (training thread: the copy is not waited for, nothing is encoded)."""
        if self._final is None:
            return
        replica, counters = self._final
        parts = self.boundary.weights_to_host([*replica.slow, *replica.momentum])
        with self._bootstrap_lock:
            self._bootstrap_parts = (parts, counters)
            self._bootstrap = None

    def bootstrap_snapshot(self) -> Snapshot | None:
        """The latest published bootstrap, compressed on first use (lossless: a joiner must
        start from exactly the donor's slow weights); None while there is no copy (one is then
        asked of the training thread)."""
        self._demand_until = time.monotonic() + BOOTSTRAP_DEMAND_S
        with self._bootstrap_lock:
            if self._bootstrap_parts is None:
                self._bootstrap_wanted.set()
                return None
            if self._bootstrap is not None:
                return self._bootstrap
            published = self._bootstrap_parts
        # Encoded outside the lock, which the training thread takes at every final step: a
        # large stage's state takes seconds to compress (1b: 4.9 GB), and it must not wait.
        parts, counters = published
        if parts.ready is not None:
            parts.ready()
        codec = self.cfg.worker.snapshot_codec
        lossless = codec if codec in LOSSLESS_CODECS else "shuffle-zstd"
        snapshot = encode_snapshot(parts.tensors, lossless, counters["outer_steps"], PartsKind.SLOW_MOMENTUM, counters)
        with self._bootstrap_lock:
            if self._bootstrap_parts is published:  # still our latest copy: kept for the next joiner
                self._bootstrap = snapshot
        return snapshot  # a final state either way; a newer one replaced it or it was dropped meanwhile

    # -- serving (server thread) --------------------------------------------------------

    def _message(self, kind: MessageKind, snapshot: Snapshot | None = None) -> list[Any]:
        return snapshot_message(kind, run_id=self.cfg.run.run_id, stage=self.stage, sender=self.worker_id,
                                snapshot=snapshot)

    def handle(self, frames: list[zmq.Frame]) -> list[Any]:
        """The reply to one message: an ACK for a kept push, a bootstrap, a probe's reply, or
        an ERROR for anything refused (and counted)."""
        try:
            decoded = self.reader.message(frames)
            header = decoded.header
            kind = MessageKind(header.kind)
            if kind == MessageKind.PROBE:  # a joiner of any stage timing its link to us: no state read
                return self._message(MessageKind.PROBE_REPLY)
            if header.stage != self.stage:
                raise SnapshotRejected("wrong_stage")
            if kind == MessageKind.BOOTSTRAP_REQUEST:
                return self._serve_bootstrap(header)
            if kind == MessageKind.OUTER_CONFIRM:
                return self._answer_confirm(header)
            if kind == MessageKind.OUTER_VERDICT:
                return self._note_verdict(header)
            if kind != MessageKind.SNAPSHOT_PUSH:
                raise SnapshotRejected("unexpected_kind")
            for_step = push_target_step(decoded)
            group_size = push_group_size(decoded)
            if not self.inbox.accepts(for_step, header.sender):
                return self._message(MessageKind.ERROR)  # a step we are past or gave up: the pusher learns it is late
            whole = self._place_chunk(header.sender, for_step, decoded)
        except SnapshotRejected as rejected:
            self.count_reject(rejected.reason)
            return self._message(MessageKind.ERROR)
        if whole is not None and not self.inbox.keep(header.sender, for_step, *whole, group_size=group_size):
            return self._message(MessageKind.ERROR)
        return snapshot_message(MessageKind.SNAPSHOT_ACK, run_id=self.cfg.run.run_id, stage=self.stage,
                                sender=self.worker_id, outer_step=header.outer_step)

    def _answer_confirm(self, header: Header) -> list[Any]:
        """A partner kept our push for our step `outer_step` but lost our acknowledgement of its
        own: our decision on its state, once made (workers/outer/verdicts.py)."""
        if header.outer_step < 0:
            raise SnapshotRejected("malformed_header")
        verdict = self.verdicts.answer(header.sender, header.outer_step)
        return self._message_at(MessageKind.OUTER_VERDICT, header.outer_step, HeaderExtra(verdict=verdict.value))

    def _note_verdict(self, header: Header) -> list[Any]:
        """A partner that finishes or leaves tells us, unasked, what it decided on our push
        for our step `outer_step` (workers/outer/verdicts.py)."""
        verdict = header.extra.verdict
        if header.outer_step < 0 or verdict not in (Verdict.USED, Verdict.DECLINED):
            raise SnapshotRejected("malformed_header")
        self.verdicts.note_told(header.sender, header.outer_step, verdict == Verdict.USED)
        return self._message_at(MessageKind.OUTER_VERDICT, header.outer_step, HeaderExtra(verdict=Verdict.UNKNOWN.value))

    def verdict_message(self, partner_step: int, used: bool) -> list[Any]:
        """Our decision on a partner's push for its step `partner_step`, told unasked."""
        verdict = Verdict.USED if used else Verdict.DECLINED
        return self._message_at(MessageKind.OUTER_VERDICT, partner_step, HeaderExtra(verdict=verdict.value))

    def _message_at(self, kind: MessageKind, outer_step: int, extra: HeaderExtra) -> list[Any]:
        return snapshot_message(kind, run_id=self.cfg.run.run_id, stage=self.stage, sender=self.worker_id,
                                outer_step=outer_step, extra=extra)

    def _place_chunk(self, sender: str, for_step: int,
                     decoded: DecodedMessage) -> tuple[Snapshot, PeerOuterState] | None:
        """Validate one chunk of a partner's push and place it; the whole contribution once
        complete. A bad chunk blacklists its sender and raises SnapshotRejected."""
        try:
            chunk = self.reader.chunk(decoded)
            return self.assemblies.add(sender, for_step, chunk, floor=self.inbox.floor)
        except SnapshotRejected as rejected:
            self._blame(sender, rejected.reason)
            raise
        except ChunkError:
            self._blame(sender, "malformed_chunk")
            raise SnapshotRejected("malformed_chunk") from None

    def _blame(self, sender: str, reason: str) -> None:
        """A well-addressed push with a bad payload: blacklist its sender, and say so unless it
        already was (a flood of bad pushes must not flood the log)."""
        already = self.blacklist.blocked(sender)
        avoid_s = self.blacklist.fail(sender)
        if already:
            return
        self.log.warning("peer_snapshot_rejected", peer=sender[:8], reason=reason, blacklisted_s=avoid_s, via="push")

    def _serve_bootstrap(self, header: Header) -> list[Any]:
        snapshot = self.bootstrap_snapshot()
        if snapshot is None:  # the requester asks again shortly (snapshot_client.pull_bootstrap)
            return self._message_at(MessageKind.BOOTSTRAP_REPLY, -1, HeaderExtra(preparing=True))
        # The coordinator pulls the same snapshot read-only, often: not worth a log line.
        if not header.extra.observer:
            self.log.info("bootstrap_served", to=header.sender[:8], checksum=snapshot.digest,
                          outer_step=snapshot.outer_step)
        return self._message(MessageKind.BOOTSTRAP_REPLY, snapshot)
