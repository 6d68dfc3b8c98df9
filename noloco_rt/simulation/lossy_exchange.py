"""What partners receive of a replica's outer-step contribution in the simulator (pure).

A worker sends its contribution (contribution_parts: θ, or φ and Δ) through
worker.snapshot_codec, compressed once per outer step, and every partner decodes the
same bytes. The simulator does the same: a lossy codec (bf16, int8, int4, int2, and the
sparse Δ rounds of worker.delta_codec) changes what partners average, and the sender uses
its own contribution as they decode it, so that the pair's corrections cancel. Stochastic
rounding draws from a generator seeded by (run seed, stage, replica, outer step), so a
simulation stays reproducible. Lossless codecs give back every bit, so their round trip is skipped.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch

from noloco_rt.algo.replica import StageReplica
from noloco_rt.config.runtime import WorkerConfig
from noloco_rt.outer.codec import decode_tensors, encode_tensors, is_lossless
from noloco_rt.outer.delta_exchange import sends_whole_state
from noloco_rt.outer.formula import OuterCoefficients, PeerOuterState
from noloco_rt.outer.snapshot import (
    contribution_parts,
    contribution_state,
    encode_snapshot,
    max_decompressed_bytes,
)


def exchange_generator(seed: int, stage: int, replica: int, outer_step: int) -> torch.Generator:
    """The generator of one replica's snapshot at one outer step: a function of those alone."""
    digest = hashlib.blake2b(f"snapshot-codec:{seed}:{stage}:{replica}:{outer_step}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)


def as_received(state: PeerOuterState, codec: str, generator: torch.Generator) -> PeerOuterState:
    """`state` as a partner decodes it: encoded as a worker's snapshot with `codec`, then
    decoded, on the device and in the dtype it had. Lossless codecs: `state` itself."""
    return exchanged(state, codec, generator, count_bytes=False)[0]


def exchanged(state: PeerOuterState, codec: str, generator: torch.Generator, *,
              count_bytes: bool = True) -> tuple[PeerOuterState, int]:
    """(`state` as a partner decodes it, its snapshot's bytes on the wire; 0 unless counted or
    lossy). Lossless codecs give back `state` itself."""
    parts, kind = contribution_parts(state)
    if is_lossless(codec):
        wire = encode_snapshot(parts, codec, 0, kind).encoded.wire_bytes if count_bytes else 0
        return state, wire
    snapshot = encode_snapshot(parts, codec, 0, kind, generator=generator)
    bound = max_decompressed_bytes([tuple(p.shape) for p in parts])
    decoded = decode_tensors(snapshot.encoded, max_decompressed_bytes=bound)
    received = contribution_state([d.to(p.device, p.dtype) for d, p in zip(decoded, parts, strict=True)], kind)
    return received, snapshot.encoded.wire_bytes


def received_states(states: Sequence[PeerOuterState], senders: Collection[int], codec: str, *, seed: int,
                    stage: int, outer_step: int) -> list[PeerOuterState]:
    """states[j] as partners receive it for every j in `senders` (the replicas some partner
    uses), the others unchanged: what the replicas of one stage exchange at one outer step."""
    return [as_received(state, codec, exchange_generator(seed, stage, j, outer_step)) if j in senders else state
            for j, state in enumerate(states)]


@dataclass
class StageRound:
    """What the replicas of one stage exchange at one outer step."""

    states: list[PeerOuterState]
    """states[j]: what replica j contributes as its partners decode it (its own exact state
    when no partner uses it, or the codec is lossless)."""
    symmetric: bool
    """The states are lossy: a replica uses its own as decoded too, so a pair's corrections
    are equal and opposite (the replicas' mean is kept exactly)."""
    local_steps_taken: bool = False
    """worker.delta_codec: the replicas' provisional local steps are taken already (they use
    what is sent, noloco_rt.outer.delta_exchange); what is left is the correction."""
    raw_bytes: int = 0
    """float32 bytes of the whole states of the senders: what an uncompressed exchange sends."""
    wire_bytes: int = 0


def stage_round(replicas: Sequence[StageReplica], senders: Collection[int], worker: WorkerConfig,
                coeffs: OuterCoefficients, *, seed: int, stage: int, outer_step: int,
                count_bytes: bool = False) -> StageRound:
    """The contributions of a stage's replicas at `outer_step`, as workers would send them:
    the whole state through worker.snapshot_codec, or, with worker.delta_codec, the round of
    noloco_rt.outer.delta_exchange (whose local steps are taken here, as a worker takes them
    before it sends)."""
    theta_only = coeffs.theta_shortcut
    raw = sum(4 * t.numel() for t in replicas[0].fast) * len(senders) * (1 if theta_only else 2)
    whole = sends_whole_state(outer_step, delta_codec=worker.delta_codec, theta_every=worker.theta_every)
    if worker.delta_codec:
        exact = [r.delta_outer_step(coeffs, delta_codec=worker.delta_codec, whole=whole, theta_only=theta_only,
                                    error_feedback=worker.error_feedback) for r in replicas]
    else:
        exact = [r.outer_state(theta_only=theta_only) for r in replicas]
    if not whole:  # x̂ is what partners decode: computed exactly, without bytes
        wire = sum(encode_tensors([t.detach().float().cpu() for t in exact[j].outer_grad], worker.delta_codec).wire_bytes
                   for j in senders) if count_bytes else 0  # type: ignore[union-attr]
        return StageRound(exact, True, True, raw, wire)
    states, wire = list(exact), 0
    for j in senders:
        states[j], size = exchanged(exact[j], worker.snapshot_codec, exchange_generator(seed, stage, j, outer_step),
                                    count_bytes=count_bytes)
        wire += size
    return StageRound(states, not is_lossless(worker.snapshot_codec), bool(worker.delta_codec), raw, wire)
