"""Token ids -> shard files of exactly `shard_tokens` ids (the last of a split may be shorter).

Each split keeps a buffer of ids not yet in a shard; at a checkpoint it is saved
under a name numbered by the checkpoint, so the progress file and the buffer it
names always belong together.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from noloco_rt.prepare.state import SPLITS, PrepareState


def shard_name(split: str, index: int) -> str:
    return f"{split}-{index:05d}.bin"


def write_atomic(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        handle.write(array.tobytes())
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


class ShardPacker:
    def __init__(self, out: Path, state: PrepareState, *, dtype: str, shard_tokens: int) -> None:
        self.out = out
        self.state = state
        self.dtype = np.dtype(dtype)
        self.shard_tokens = shard_tokens
        self.buffers: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}
        self.buffered = {s: 0 for s in SPLITS}
        for split in SPLITS:  # the ids a previous run had read but not yet packed
            name = state.pending[split]
            if name:
                self._append(split, np.fromfile(out / name, dtype=self.dtype))

    def _append(self, split: str, ids: np.ndarray) -> None:
        self.buffers[split].append(ids)
        self.buffered[split] += len(ids)

    def add(self, split: str, ids: list[int], eos_id: int) -> bool:
        """Append one document and its separator; True when a shard was written."""
        self._append(split, np.asarray([*ids, eos_id], dtype=self.dtype))
        wrote = False
        while self.buffered[split] >= self.shard_tokens:
            stream = np.concatenate(self.buffers[split])
            self._write_shard(split, stream[:self.shard_tokens])
            rest = stream[self.shard_tokens:]
            self.buffers[split], self.buffered[split] = [rest], len(rest)
            wrote = True
        return wrote

    def _write_shard(self, split: str, ids: np.ndarray) -> None:
        shards = self.state.shards[split]
        name = shard_name(split, len(shards))
        write_atomic(self.out / name, ids)
        shards.append({"file": name, "tokens": int(len(ids))})

    def save_pending(self) -> list[Path]:
        """Write the buffers under this checkpoint's names; returns the files they replace."""
        self.state.checkpoint += 1
        stale = [self.out / n for n in self.state.pending.values() if n]
        for split in SPLITS:
            name = None
            if self.buffered[split]:
                name = f"pending-{split}-{self.state.checkpoint:06d}.bin"
                write_atomic(self.out / name, np.concatenate(self.buffers[split]))
            self.state.pending[split] = name
        return stale

    def finish(self) -> None:
        """The last, shorter shard of each split."""
        for split in SPLITS:
            if self.buffered[split]:
                self._write_shard(split, np.concatenate(self.buffers[split]))
                self.buffers[split], self.buffered[split] = [], 0
