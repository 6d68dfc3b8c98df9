"""The snapshot format of the outer exchange and the joiner's bootstrap (docs/architecture.md §4), pure.

A snapshot is one compressed payload of tensors plus a small header: run, stage, outer
step, codec, tensor specs, what the parts are, a checksum and (for bootstraps) counters.
This module encodes snapshots into wire frames and validates received ones in full:
wire limits, message kind, checksum, specs, shapes, parts kind, payload size, bounded
decompression and finite values. Every refusal raises SnapshotRejected with a reason
that callers count. No sockets, no threads: the server and the clients live elsewhere.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from noloco_rt.config.choices import DELTA_CODECS
from noloco_rt.counts import is_count
from noloco_rt.net.header_extra import HeaderExtra
from noloco_rt.net.wire import (
    PROTOCOL_VERSION,
    DecodedMessage,
    Header,
    MessageKind,
    WireLimits,
    WireReject,
    decode_message,
    encode_message,
)
from noloco_rt.outer.chunks import ChunkError, Piece, parse_chunk_position, parse_pieces
from noloco_rt.outer.codec import (
    CodecError,
    EncodedTensors,
    TensorSpec,
    checksum,
    decode_tensors,
    encode_quantized_tensors,
    encode_tensors,
)
from noloco_rt.outer.codecs.quantized import QuantizedTensor
from noloco_rt.outer.formula import PeerOuterState

SNAPSHOT_LIMITS = WireLimits(max_frame_bytes=64 << 30, max_message_bytes=(64 << 30) + (1 << 20))
# zstd's worst case grows incompressible input by well under 1 %; anything larger than
# the raw size plus this slack is not an honest snapshot.
PAYLOAD_SLACK_BYTES = 1 << 16
# Room for codec framing on top of two float32 copies of the stage's weights.
DECOMPRESSED_SLACK_BYTES = 1 << 20
# A push's claimed group size above this is malformed (no stage has that many replicas).
MAX_GROUP_SIZE = 1024


class PartsKind(enum.StrEnum):
    """What a snapshot's tensors are, in order."""

    FAST = "fast"
    """θ alone (the γ = β shortcut): one copy of the stage's parameters."""
    SLOW_GRAD = "slow+grad"
    """φ then Δ: two copies."""
    SLOW_MOMENTUM = "slow+momentum"
    """φ then δ, for joiners (lossless): two copies."""
    GRAD = "grad"
    """Δ alone, sparse (a round of worker.delta_codec): one copy."""

    @property
    def copies(self) -> int:
        return 1 if self in (PartsKind.FAST, PartsKind.GRAD) else 2


class SnapshotRejected(ValueError):
    """A received snapshot is refused; `reason` is the counted label."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Snapshot:
    """Immutable once published: the header fields and the compressed payload."""

    outer_step: int
    parts_kind: str
    """A PartsKind value."""
    encoded: EncodedTensors
    digest: str
    counters: dict[str, int]


@dataclass(frozen=True)
class ReceivedChunk:
    """A validated chunk of a streamed contribution, decoded."""

    index: int
    total: int
    pieces: list[Piece]
    snapshot: Snapshot
    """The chunk's own payload (specs: one 1-D spec per piece)."""
    values: list[torch.Tensor]


def encode_snapshot(tensors: Sequence[torch.Tensor], codec: str, outer_step: int, parts_kind: PartsKind,
                    counters: dict[str, int] | None = None, *,
                    generator: torch.Generator | None = None) -> Snapshot:
    """Compress detached float32 CPU copies of `tensors` once, with their checksum.
    `generator` drives a quantised codec's stochastic rounding (None: a fresh one)."""
    encoded = encode_tensors([t.detach().float().cpu() for t in tensors], codec, generator=generator)
    return Snapshot(outer_step, parts_kind.value, encoded, checksum(encoded.payload), counters or {})


def encode_quantized_snapshot(tensors: Sequence[QuantizedTensor], codec: str, outer_step: int,
                              parts_kind: PartsKind) -> Snapshot:
    """A snapshot of flat tensors quantised already (on the replica's device), with its
    checksum: the same payload `encode_snapshot` would give with that rounding."""
    encoded = encode_quantized_tensors(tensors, codec)
    return Snapshot(outer_step, parts_kind.value, encoded, checksum(encoded.payload), {})


def contribution_parts(state: PeerOuterState) -> tuple[list[torch.Tensor], PartsKind]:
    """The tensors a group member sends for its outer step, and what they are."""
    if state.fast is not None:
        return list(state.fast), PartsKind.FAST
    if state.grad_only:
        return list(state.outer_grad), PartsKind.GRAD  # type: ignore[arg-type]
    if state.slow is None or state.outer_grad is None:
        raise ValueError("a contribution needs fast weights, or slow weights and outer gradient")
    return list(state.slow) + list(state.outer_grad), PartsKind.SLOW_GRAD


def contribution_state(tensors: Sequence[torch.Tensor], parts_kind: PartsKind) -> PeerOuterState:
    """The contribution a group member's decoded tensors stand for (inverse of contribution_parts)."""
    if parts_kind is PartsKind.FAST:
        return PeerOuterState(fast=list(tensors))
    if parts_kind is PartsKind.GRAD:
        return PeerOuterState(outer_grad=list(tensors))
    if parts_kind is not PartsKind.SLOW_GRAD:
        raise ValueError(f"{parts_kind.value} parts are not a contribution")
    half = len(tensors) // 2
    return PeerOuterState(slow=list(tensors[:half]), outer_grad=list(tensors[half:]))


def snapshot_message(kind: MessageKind, *, run_id: str, stage: int, sender: str, snapshot: Snapshot | None = None,
                     outer_step: int = -1, extra: HeaderExtra | None = None) -> list[Any]:
    """Wire frames of a snapshot message. Without a snapshot (a request for one, or an
    answer that has none) the header carries `outer_step` and `extra` and no payload; with
    one, `extra` adds to the snapshot's own fields (a push's `for_step`)."""
    if snapshot is None:
        header = Header(version=PROTOCOL_VERSION, run_id=run_id, kind=kind, sender=sender, microbatch_id=0,
                        attempt=0, outer_step=outer_step, stage=stage, codec="raw", tensors=[],
                        extra=extra or HeaderExtra())
        return encode_message(header, [])
    payload = snapshot.encoded.payload
    header = Header(version=PROTOCOL_VERSION, run_id=run_id, kind=kind, sender=sender, microbatch_id=0,
                    attempt=0, outer_step=snapshot.outer_step, stage=stage, codec="raw",
                    tensors=[{"shape": [len(payload)], "dtype": "uint8", "nbytes": len(payload)}],
                    extra=replace(extra or HeaderExtra(), codec=snapshot.encoded.codec, parts=str(snapshot.parts_kind),
                                  specs=[[list(s.shape), s.dtype] for s in snapshot.encoded.specs],
                                  checksum=snapshot.digest, counters=snapshot.counters))
    return encode_message(header, [payload])


def chunk_message(kind: MessageKind, *, run_id: str, stage: int, sender: str, chunk: Snapshot, index: int,
                  total: int, pieces: Sequence[Piece], for_step: int, group_size: int | None = None) -> list[Any]:
    """Wire frames of chunk `index` of `total` of a streamed contribution (its pieces encoded
    as one snapshot), for a receiver whose outer step is `for_step`; `group_size`: the group
    as the sender computed it, itself included (the pair's weight: correction.py)."""
    extra = HeaderExtra(for_step=for_step, chunk=[index, total], pieces=[p.as_wire() for p in pieces],
                        group=group_size)
    return snapshot_message(kind, run_id=run_id, stage=stage, sender=sender, snapshot=chunk, extra=extra)


def push_target_step(decoded: DecodedMessage) -> int:
    """The receiver's outer step a push is for (its `for_step`; the sender's own step when
    absent: seeded groups pair equal steps). Raises SnapshotRejected when malformed."""
    value = decoded.header.extra.for_step
    if value is None:
        value = decoded.header.outer_step
    if not is_count(value):
        raise SnapshotRejected("malformed_header")
    return value


def push_group_size(decoded: DecodedMessage) -> int | None:
    """The size of the group the sender of a push computed, itself included; None when the
    header has none (then the receiver's own size stands for it). Raises SnapshotRejected
    when malformed."""
    value = decoded.header.extra.group
    if value is None:
        return None
    if not 2 <= value <= MAX_GROUP_SIZE:
        raise SnapshotRejected("malformed_header")
    return value


def max_decompressed_bytes(shapes: Sequence[Sequence[int]]) -> int:
    """The most a snapshot of a stage with these parameter shapes may decompress to."""
    return 2 * 4 * sum(math.prod(int(d) for d in s) for s in shapes) + DECOMPRESSED_SLACK_BYTES


def bootstrap_preparing(decoded: DecodedMessage) -> bool:
    """Whether a reply says the donor is copying its state for us (no snapshot yet)."""
    return MessageKind(decoded.header.kind) == MessageKind.BOOTSTRAP_REPLY and \
        decoded.header.extra.preparing and not decoded.tensors


MAX_COUNTER = 2**53
"""Inner and outer step counts beyond this are not a run's (a joiner would adopt them)."""
COUNTER_NAMES = frozenset({"inner_steps", "outer_steps"})


def snapshot_counters(value: Any) -> dict[str, int]:
    """A bootstrap's counters, validated (pure): absent is {}, else a map of known names to
    integers in [0, MAX_COUNTER]; SnapshotRejected("malformed_counters") otherwise (a joiner
    adopts them as its own step counts)."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not set(value) <= COUNTER_NAMES:
        raise SnapshotRejected("malformed_counters")
    for count in value.values():
        if not is_count(count, MAX_COUNTER):
            raise SnapshotRejected("malformed_counters")
    return dict(value)


def require_kind(decoded: DecodedMessage, kind: MessageKind) -> None:
    """A reply of another kind (an ERROR, say) holds no snapshot."""
    if MessageKind(decoded.header.kind) != kind:
        raise SnapshotRejected("no_snapshot")


class SnapshotReader:
    """Validates received snapshots of one stage of one run (the stage's parameter shapes)."""

    def __init__(self, run_id: str, expected_shapes: Sequence[tuple[int, ...]]) -> None:
        self.run_id = run_id
        self.expected_shapes = [tuple(s) for s in expected_shapes]
        self.max_decompressed_bytes = max_decompressed_bytes(self.expected_shapes)

    def message(self, frames: Sequence[Any]) -> DecodedMessage:
        """The decoded wire message; wire rejects become SnapshotRejected with the same reason."""
        try:
            return decode_message(frames, expected_run_id=self.run_id, limits=SNAPSHOT_LIMITS)
        except WireReject as reject:
            raise SnapshotRejected(reject.reason.value) from None

    def snapshot(self, decoded: DecodedMessage) -> Snapshot:
        """Rebuild a Snapshot from a decoded message, verifying size, checksum, specs and shapes."""
        return self._snapshot(decoded, lambda parts_kind: self.expected_shapes * parts_kind.copies)

    def _snapshot(self, decoded: DecodedMessage,
                  expected_shapes: Callable[[PartsKind], Sequence[tuple[int, ...]]]) -> Snapshot:
        header = decoded.header
        extra = header.extra
        if not decoded.tensors or extra.specs is None:
            raise SnapshotRejected("empty_snapshot")
        if decoded.tensors[0].numel() > self.max_decompressed_bytes + PAYLOAD_SLACK_BYTES:
            raise SnapshotRejected("payload_too_large")
        payload = decoded.tensors[0].numpy().tobytes()
        if checksum(payload) != extra.checksum:
            raise SnapshotRejected("checksum")
        specs = [TensorSpec(shape=tuple(shape), dtype=dtype) for shape, dtype in extra.specs]  # typed on decode
        parts_kind = extra.parts or ""
        if parts_kind not in tuple(PartsKind) or \
                [s.shape for s in specs] != list(expected_shapes(PartsKind(parts_kind))):
            raise SnapshotRejected("shape_mismatch")
        codec = str(extra.codec)
        if (parts_kind == PartsKind.GRAD) != (codec in DELTA_CODECS):  # Δ alone travels sparse, states never
            raise SnapshotRejected("wrong_codec")
        encoded = EncodedTensors(codec=codec, specs=specs, payload=payload,
                                 raw_bytes=sum(4 * s.numel for s in specs), wire_bytes=len(payload))
        return Snapshot(header.outer_step, parts_kind, encoded, str(extra.checksum),
                        snapshot_counters(extra.counters))

    def chunk(self, decoded: DecodedMessage) -> ReceivedChunk:
        """One chunk of a partner's streamed contribution, validated in full: its place in
        the stage's tensors, then the same checks as a whole snapshot on its pieces."""
        extra = decoded.header.extra
        parts_kind = extra.parts or ""
        if parts_kind == PartsKind.SLOW_MOMENTUM:
            raise SnapshotRejected("wrong_parts")
        if parts_kind not in tuple(PartsKind):
            raise SnapshotRejected("shape_mismatch")
        numels = [math.prod(s) for s in self.expected_shapes] * PartsKind(parts_kind).copies
        try:
            index, total = parse_chunk_position(extra.chunk)
            pieces = parse_pieces(extra.pieces, numels)
        except ChunkError:
            raise SnapshotRejected("malformed_chunk") from None
        snapshot = self._snapshot(decoded, lambda _: [(p.count,) for p in pieces])
        return ReceivedChunk(index, total, pieces, snapshot, self.tensors(snapshot))

    def tensors(self, snapshot: Snapshot) -> list[torch.Tensor]:
        """The snapshot's tensors, decompressed within the bound and all finite."""
        try:
            tensors = decode_tensors(snapshot.encoded, max_decompressed_bytes=self.max_decompressed_bytes)
        except CodecError as exc:
            raise SnapshotRejected("codec") from exc
        if not all(bool(torch.isfinite(t).all()) for t in tensors):
            raise SnapshotRejected("non_finite")
        return tensors

    def contribution(self, decoded: DecodedMessage) -> tuple[Snapshot, PeerOuterState]:
        """A peer's outer-step contribution (θ, or φ and Δ), validated in full."""
        snapshot = self.snapshot(decoded)
        if snapshot.parts_kind == PartsKind.SLOW_MOMENTUM:
            raise SnapshotRejected("wrong_parts")
        return snapshot, contribution_state(self.tensors(snapshot), PartsKind(snapshot.parts_kind))

    def bootstrap(self, decoded: DecodedMessage) -> tuple[Snapshot, list[torch.Tensor]]:
        """A donor's slow weights then momentum, validated in full."""
        snapshot = self.snapshot(decoded)
        if snapshot.parts_kind != PartsKind.SLOW_MOMENTUM:
            raise SnapshotRejected("wrong_parts")
        return snapshot, self.tensors(snapshot)
