"""A snapshot streamed in chunks (docs/architecture.md §4), pure: which elements travel in which chunk,
and their assembly on the receiving side.

A contribution is a list of float32 tensors. The sender cuts their flattened elements into
pieces (tensor, first element, count), splitting a tensor only at multiples of ALIGN
elements, so a blockwise codec (64-element blocks) sees exactly the blocks it would see
encoding whole tensors; pieces are grouped into chunks of at most `chunk_elems` elements,
each compressed and sent on its own, so compressing one chunk, sending the one before and
decoding the one before that overlap. The receiver checks every piece against the stage's
shapes before it places it; an assembly is complete once every element arrived exactly once.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

ALIGN = 64
"""Pieces of one tensor start at multiples of this (the quantised codecs' block)."""
MAX_CHUNKS = 1 << 16
MAX_PIECES_PER_CHUNK = 4096


class ChunkError(ValueError):
    """A chunk that cannot belong to the snapshot it claims to be part of."""


@dataclass(frozen=True)
class Piece:
    """Elements [start, start + count) of the flattened tensor number `tensor`."""

    tensor: int
    start: int
    count: int

    def as_wire(self) -> list[int]:
        return [self.tensor, self.start, self.count]


def plan_chunks(numels: Sequence[int], chunk_elems: int, *, align: int = ALIGN) -> list[list[Piece]]:
    """The pieces of each chunk, in order, covering every element of every tensor once; a
    tensor is cut only at multiples of `align` (a multiple of ALIGN: the sparse codecs'
    4,096-element chunks for Δ alone, so a piece sees the chunks the whole tensor has)."""
    if align < ALIGN or align % ALIGN:
        raise ValueError(f"align must be a multiple of {ALIGN}, got {align}")
    if chunk_elems < ALIGN:
        raise ValueError(f"chunk_elems must be >= {ALIGN}, got {chunk_elems}")
    chunk_elems = max(chunk_elems, align)
    capacity = chunk_elems // align * align
    chunks: list[list[Piece]] = []
    current: list[Piece] = []
    room = capacity
    for index, numel in enumerate(numels):
        start = 0
        while start < numel:
            left = numel - start
            count = left if left <= room else room // align * align  # a tensor is cut at `align` only
            if count == 0:
                chunks.append(current)
                current, room = [], capacity
                continue
            current.append(Piece(index, start, count))
            start += count
            room -= count
    if current or not chunks:
        chunks.append(current)
    if len(chunks) > MAX_CHUNKS:
        raise ValueError(f"{len(chunks)} chunks is more than {MAX_CHUNKS}: raise the chunk size")
    return chunks


def piece_views(tensors: Sequence[torch.Tensor], pieces: Sequence[Piece]) -> list[torch.Tensor]:
    """The 1-D views of contiguous tensors that the pieces stand for (no copy)."""
    return [tensors[p.tensor].reshape(-1)[p.start:p.start + p.count] for p in pieces]


def parse_pieces(value: object, numels: Sequence[int]) -> list[Piece]:
    """A chunk's pieces from its header, each inside its tensor; raises ChunkError."""
    if not isinstance(value, list) or not 0 < len(value) <= MAX_PIECES_PER_CHUNK:
        raise ChunkError("pieces must be a non-empty list")
    pieces = []
    for item in value:
        if not (isinstance(item, list) and len(item) == 3
                and all(isinstance(v, int) and not isinstance(v, bool) for v in item)):
            raise ChunkError(f"a piece is [tensor, start, count] of ints, got {item!r}")
        tensor, start, count = item
        if not 0 <= tensor < len(numels) or start < 0 or count < 1 or start + count > numels[tensor]:
            raise ChunkError(f"piece {item} is outside the stage's tensors")
        pieces.append(Piece(tensor, start, count))
    return pieces


def parse_chunk_position(value: object) -> tuple[int, int]:
    """(index, total) of a chunk from its header; raises ChunkError."""
    if not (isinstance(value, list) and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
        raise ChunkError("chunk must be [index, total]")
    index, total = value
    if not 0 <= index < total <= MAX_CHUNKS:
        raise ChunkError(f"chunk {index} of {total} is out of range")
    return index, total


class ChunkAssembly:
    """The tensors of one snapshot filled in as its chunks arrive, each element once."""

    def __init__(self, shapes: Sequence[tuple[int, ...]], chunks_total: int) -> None:
        self.shapes = [tuple(s) for s in shapes]
        self.numels = [math.prod(s) for s in self.shapes]
        self.chunks_total = chunks_total
        self.flat = [torch.empty(n, dtype=torch.float32) for n in self.numels]
        self.elements_missing = sum(self.numels)
        self._chunks_seen: set[int] = set()
        self._filled: list[list[tuple[int, int]]] = [[] for _ in self.numels]
        """Per tensor, the sorted, disjoint element ranges already placed."""

    @property
    def complete(self) -> bool:
        return self.elements_missing == 0 and len(self._chunks_seen) == self.chunks_total

    def add(self, index: int, pieces: Sequence[Piece], values: Sequence[torch.Tensor]) -> None:
        """Place one chunk's decoded pieces; raises ChunkError (and places nothing) for a
        chunk seen before or a piece overlapping elements already placed."""
        if index in self._chunks_seen or index >= self.chunks_total:
            raise ChunkError(f"chunk {index} arrived twice or is out of range")
        if len(values) != len(pieces) or any(v.numel() != p.count for p, v in zip(pieces, values, strict=True)):
            raise ChunkError("decoded values do not match the pieces")
        claimed = [list(ranges) for ranges in self._filled]
        for p in pieces:
            _claim(claimed[p.tensor], p.start, p.start + p.count)
        for p, v in zip(pieces, values, strict=True):
            self.flat[p.tensor][p.start:p.start + p.count] = v.reshape(-1)
        self._filled = claimed
        self._chunks_seen.add(index)
        self.elements_missing -= sum(p.count for p in pieces)

    def tensors(self) -> list[torch.Tensor]:
        """The assembled tensors in their shapes (only once complete)."""
        if not self.complete:
            raise ChunkError("the snapshot is not complete")
        return [f.view(shape) for f, shape in zip(self.flat, self.shapes, strict=True)]


def _claim(ranges: list[tuple[int, int]], start: int, end: int) -> None:
    """Insert [start, end) into sorted disjoint ranges; ChunkError if it overlaps one."""
    at = bisect.bisect_left(ranges, (start, end))
    if (at > 0 and ranges[at - 1][1] > start) or (at < len(ranges) and ranges[at][0] < end):
        raise ChunkError(f"elements [{start}, {end}) arrived twice")
    ranges.insert(at, (start, end))
