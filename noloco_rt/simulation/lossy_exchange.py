"""What partners receive of a replica's outer-step contribution in the simulator (pure).

A worker sends its contribution (contribution_parts: θ, or φ and Δ) through
worker.snapshot_codec, compressed once per outer step, and every partner decodes the
same bytes. The simulator does the same: a lossy codec (bf16, int8, int4) changes what
partners average, never the sender's own state. Stochastic rounding draws from a
generator seeded by (run seed, stage, replica, outer step), so a simulation stays
reproducible. Lossless codecs give back every bit, so their round trip is skipped.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence

import torch

from noloco_rt.outer.codec import decode_tensors, is_lossless
from noloco_rt.outer.formula import PeerOuterState
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
    if is_lossless(codec):
        return state
    parts, kind = contribution_parts(state)
    snapshot = encode_snapshot(parts, codec, 0, kind, generator=generator)
    bound = max_decompressed_bytes([tuple(p.shape) for p in parts])
    decoded = decode_tensors(snapshot.encoded, max_decompressed_bytes=bound)
    return contribution_state([d.to(p.device, p.dtype) for d, p in zip(decoded, parts, strict=True)], kind)


def received_states(states: Sequence[PeerOuterState], senders: Collection[int], codec: str, *, seed: int,
                    stage: int, outer_step: int) -> list[PeerOuterState]:
    """states[j] as partners receive it for every j in `senders` (the replicas some partner
    uses), the others unchanged: what the replicas of one stage exchange at one outer step."""
    return [as_received(state, codec, exchange_generator(seed, stage, j, outer_step)) if j in senders else state
            for j, state in enumerate(states)]
