"""Streaming a snapshot in chunks (noloco_rt/outer/chunks.py, the chunk checks of the snapshot
reader and workers/outer/assembly.py): every element travels exactly once, a blockwise
codec sees the blocks it would see on whole tensors, chunks assemble in any order, and a
chunk that does not fit its snapshot is refused without touching what arrived before."""

from __future__ import annotations

import math
import random

import msgpack
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from noloco_rt.net.wire import MessageKind
from noloco_rt.outer.chunks import (
    ALIGN,
    ChunkAssembly,
    ChunkError,
    Piece,
    parse_pieces,
    piece_views,
    plan_chunks,
)
from noloco_rt.outer.codec import decode_tensors
from noloco_rt.outer.snapshot import (
    PartsKind,
    SnapshotReader,
    SnapshotRejected,
    chunk_message,
    encode_snapshot,
    push_group_size,
)
from workers.outer.assembly import PushAssemblies

RUN = "run-chunks"
SHAPES = [(300, 7), (5,), (64, 64), (1,)]


@settings(max_examples=200, deadline=None)
@given(numels=st.lists(st.integers(0, 5000), min_size=1, max_size=8), chunk_elems=st.integers(ALIGN, 3000))
def test_the_plan_covers_every_element_once_in_aligned_bounded_chunks(numels, chunk_elems):
    chunks = plan_chunks(numels, chunk_elems)
    seen = [[0] * n for n in numels]
    for pieces in chunks:
        assert sum(p.count for p in pieces) <= chunk_elems
        for p in pieces:
            assert p.start % ALIGN == 0  # a blockwise codec's blocks never straddle two pieces
            for i in range(p.start, p.start + p.count):
                seen[p.tensor][i] += 1
    assert all(count == 1 for per_tensor in seen for count in per_tensor)
    assert all(chunks[:-1])  # no empty chunk travels (the last is empty only when there is nothing)


def test_int8_on_pieces_keeps_the_blocks_of_whole_tensors():
    # Each 64-element block of the whole tensor holds whole multiples of its own scale, one of
    # them 127 steps: int8 round-trips it exactly when blocks are the whole tensor's, and would
    # not if a piece cut a block (neighbouring blocks' scales differ). The scales are powers of
    # two so that 127 * s, k * s and x / s are exact in float32: a scale of any other value may
    # round up by one ulp, and stochastic rounding then sends k - epsilon to k - 1 now and then.
    blocks = torch.randint(-127, 128, (40, ALIGN)).float()
    blocks[:, 0] = 127.0
    scales = torch.pow(2.0, -(torch.arange(40) % 5).float())[:, None]  # (40, 1): 1, 1/2, .., 1/16
    tensor = (blocks * scales).reshape(-1)
    pieces = [p for chunk in plan_chunks([tensor.numel()], 3 * ALIGN) for p in chunk]
    assert len(pieces) > 1
    encoded = encode_snapshot(piece_views([tensor], pieces), "int8-zstd", 1, PartsKind.FAST).encoded
    decoded = torch.cat(decode_tensors(encoded, max_decompressed_bytes=1 << 20))
    torch.testing.assert_close(decoded, tensor, rtol=1e-6, atol=1e-6)


def _chunk_frames(tensors, chunk_elems, *, codec="shuffle-zstd", outer_step=3, for_step=3, sender="p",
                  group_size=None):
    plan = plan_chunks([t.numel() for t in tensors], chunk_elems)
    frames = []
    for index, pieces in enumerate(plan):
        chunk = encode_snapshot(piece_views(tensors, pieces), codec, outer_step, PartsKind.FAST)
        frames.append(chunk_message(MessageKind.SNAPSHOT_PUSH, run_id=RUN, stage=1, sender=sender, chunk=chunk,
                                    index=index, total=len(plan), pieces=pieces, for_step=for_step,
                                    group_size=group_size))
    return frames


def test_a_push_says_the_group_size_its_sender_computed_and_a_bad_one_is_malformed():
    reader = SnapshotReader(RUN, SHAPES)
    tensors = [torch.randn(s) for s in SHAPES]
    assert push_group_size(reader.message(_chunk_frames(tensors, 1000, group_size=3)[0])) == 3
    assert push_group_size(reader.message(_chunk_frames(tensors, 1000)[0])) is None  # an older sender
    for bad in (1, 0, -2, 1025, "3", 2.0, True, [3]):
        frames = _tamper(_chunk_frames(tensors, 1000, group_size=3)[0], group=bad)
        with pytest.raises(SnapshotRejected, match="malformed_header"):
            push_group_size(reader.message(frames))


def test_chunks_assemble_in_any_order_to_the_exact_tensors():
    reader = SnapshotReader(RUN, SHAPES)
    tensors = [torch.randn(s) for s in SHAPES]
    frames = _chunk_frames(tensors, 1000)
    assert len(frames) > 3
    random.Random(0).shuffle(frames)
    assemblies = PushAssemblies(SHAPES, stale_s=60)
    results = [assemblies.add("p", 3, reader.chunk(reader.message(f))) for f in frames]
    assert all(r is None for r in results[:-1])
    snapshot, state = results[-1]
    assert snapshot.outer_step == 3 and snapshot.parts_kind == PartsKind.FAST
    assert snapshot.encoded.raw_bytes == 4 * sum(math.prod(s) for s in SHAPES)
    for got, want in zip(state.fast, tensors, strict=True):
        assert torch.equal(got, want)
    assert len(assemblies) == 0


def test_a_repeated_or_contradicting_chunk_is_refused_and_changes_nothing():
    reader = SnapshotReader(RUN, SHAPES)
    tensors = [torch.randn(s) for s in SHAPES]
    frames = _chunk_frames(tensors, 1000)
    assemblies = PushAssemblies(SHAPES, stale_s=60)
    assert assemblies.add("p", 3, reader.chunk(reader.message(frames[0]))) is None
    with pytest.raises(ChunkError):
        assemblies.add("p", 3, reader.chunk(reader.message(frames[0])))
    other_step = _chunk_frames(tensors, 1000, outer_step=4)[1]
    with pytest.raises(ChunkError):
        assemblies.add("p", 3, reader.chunk(reader.message(other_step)))
    results = [assemblies.add("p", 3, reader.chunk(reader.message(f))) for f in frames[1:]]
    assert results[-1] is not None and torch.equal(results[-1][1].fast[0], tensors[0])


def test_overlapping_pieces_are_refused_before_anything_is_placed():
    assembly = ChunkAssembly([(10,)], chunks_total=2)
    assembly.add(0, [Piece(0, 0, 6)], [torch.ones(6)])
    with pytest.raises(ChunkError):
        assembly.add(1, [Piece(0, 6, 2), Piece(0, 5, 5)], [torch.ones(2), torch.ones(5)])
    assert assembly.elements_missing == 4 and not assembly.complete
    assembly.add(1, [Piece(0, 6, 4)], [torch.zeros(4)])
    assert assembly.complete and assembly.tensors()[0].sum() == 6


@pytest.mark.parametrize("pieces", [
    "junk", [], [[0, 0]], [[0, 0, 0]], [[9, 0, 1]], [[0, -1, 2]], [[0, 2095, 6]], [[True, 0, 1]],
])
def test_pieces_outside_the_stage_are_malformed(pieces):
    with pytest.raises(ChunkError):
        parse_pieces(pieces, [2100, 5])


def _tamper(frames, **extra):
    header = msgpack.unpackb(bytes(frames[0]), raw=False)
    header["extra"].update(extra)
    return [msgpack.packb(header, use_bin_type=True), *frames[1:]]


@pytest.mark.parametrize(("change", "reason"), [
    ({"chunk": [5, 2]}, "malformed_chunk"),
    ({"chunk": None}, "malformed_header"),  # not [index, total]: the header's own check
    ({"pieces": [[0, 0, 10**9]]}, "malformed_chunk"),
    ({"pieces": [[0, 0, 7]]}, "shape_mismatch"),  # the payload holds another number of elements
    ({"parts": "slow+momentum"}, "wrong_parts"),
])
def test_the_reader_refuses_a_chunk_that_lies_about_its_place(change, reason):
    reader = SnapshotReader(RUN, SHAPES)
    frames = _chunk_frames([torch.randn(s) for s in SHAPES], 1000)[0]
    with pytest.raises(SnapshotRejected) as refused:
        reader.chunk(reader.message(_tamper(frames, **change)))
    assert refused.value.reason == reason
