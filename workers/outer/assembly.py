"""Partners' streamed contributions, put together chunk by chunk on the exchange server's thread.

Each chunk was validated in full before it gets here (noloco_rt.outer.snapshot); this keeps
the partly received snapshots, checks that a chunk agrees with the earlier ones of its
snapshot, and hands over the whole contribution when its last chunk is placed. Bounded:
a partial snapshot holds a stage's worth of tensors, so at most `max_partial` are kept
(the oldest dropped first), and one that received nothing for `stale_s` is dropped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from noloco_rt.outer.chunks import ChunkAssembly, ChunkError
from noloco_rt.outer.codec import EncodedTensors
from noloco_rt.outer.formula import PeerOuterState
from noloco_rt.outer.snapshot import PartsKind, ReceivedChunk, Snapshot, contribution_state

MAX_PARTIAL = 4


@dataclass
class _Partial:
    touched: float
    outer_step: int
    """The sender's outer step."""
    parts_kind: PartsKind
    codec: str
    assembly: ChunkAssembly
    wire_bytes: int = 0
    raw_bytes: int = 0

    def agrees(self, chunk: ReceivedChunk) -> bool:
        snapshot = chunk.snapshot
        return (snapshot.outer_step, snapshot.parts_kind, snapshot.encoded.codec, chunk.total) == \
            (self.outer_step, self.parts_kind.value, self.codec, self.assembly.chunks_total)


class PushAssemblies:
    """Partly received contributions by (sender, our outer step they are for)."""

    def __init__(self, expected_shapes: Sequence[tuple[int, ...]], *, stale_s: float,
                 max_partial: int = MAX_PARTIAL, clock: Callable[[], float] = time.monotonic) -> None:
        self.expected_shapes = [tuple(s) for s in expected_shapes]
        self.stale_s = stale_s
        self.max_partial = max_partial
        self.clock = clock
        self._partials: dict[tuple[str, int], _Partial] = {}

    def __len__(self) -> int:
        return len(self._partials)

    def add(self, sender: str, for_step: int, chunk: ReceivedChunk, *,
            floor: int = 0) -> tuple[Snapshot, PeerOuterState] | None:
        """Place a chunk; the sender's whole contribution once its last chunk is here, else
        None. Raises ChunkError for a chunk that contradicts its snapshot's earlier chunks
        (another step, parts kind, codec or chunk count, or elements already received)."""
        now = self.clock()
        for key in [k for k, p in self._partials.items() if k[1] < floor or now - p.touched >= self.stale_s]:
            del self._partials[key]
        key = (sender, for_step)
        partial = self._partials.get(key)
        if partial is None:
            partial = self._start(key, chunk)
        elif not partial.agrees(chunk):
            raise ChunkError("the chunk belongs to another snapshot than its sender's earlier chunks")
        partial.assembly.add(chunk.index, chunk.pieces, chunk.values)
        partial.touched = now
        partial.wire_bytes += chunk.snapshot.encoded.wire_bytes
        partial.raw_bytes += chunk.snapshot.encoded.raw_bytes
        if not partial.assembly.complete:
            return None
        del self._partials[key]
        summary = Snapshot(partial.outer_step, partial.parts_kind.value,
                           EncodedTensors(codec=partial.codec, specs=[], payload=b"", raw_bytes=partial.raw_bytes,
                                          wire_bytes=partial.wire_bytes), digest="", counters={})
        return summary, contribution_state(partial.assembly.tensors(), partial.parts_kind)

    def _start(self, key: tuple[str, int], chunk: ReceivedChunk) -> _Partial:
        while len(self._partials) >= self.max_partial:  # the oldest first: the likeliest abandoned
            del self._partials[min(self._partials, key=lambda k: self._partials[k].touched)]
        parts_kind = PartsKind(chunk.snapshot.parts_kind)
        partial = _Partial(self.clock(), chunk.snapshot.outer_step, parts_kind, chunk.snapshot.encoded.codec,
                           ChunkAssembly(self.expected_shapes * parts_kind.copies, chunk.total))
        self._partials[key] = partial
        return partial

    def clear(self) -> None:
        self._partials.clear()
