"""Byte-level tokenizer, the three corpus sources and deterministic per-worker sharding.

Sources:
  stdlib  the Python standard library's own .py files, found through sysconfig (no
          download); test folders and site-packages excluded.
  files   text files or globs the user names.
  tokens  pre-tokenized uint16/uint32 files, read through numpy.memmap, or a directory
          written by `noloco-rt prepare` (its own train/val shards and dtype).

Files go to train or validation by a hash of their path (relative to the stdlib root
for the bundled corpus, so the split is the same on every machine). A single file
that cannot be split that way holds out its tail instead.
"""

from __future__ import annotations

import glob
import os
import sysconfig
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from noloco_rt.config import DataConfig
from noloco_rt.config.prepared_manifest import find_prepared_dir, read_manifest
from noloco_rt.counts import is_count

BYTE_VOCAB_SIZE = 256
DOCUMENT_SEPARATOR = b"\n\n"
EXCLUDED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "__pycache__"})


class DataError(ValueError):
    """The corpus cannot be built from what the config names."""


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode(tokens: Iterable[int]) -> str:
    return bytes(int(t) & 0xFF for t in tokens).decode("utf-8", errors="replace")


def is_validation_path(key: str, val_percent: float) -> bool:
    """Deterministic split: the path's crc32, in hundredths of a percent."""
    return zlib.crc32(key.encode()) % 10_000 < val_percent * 100


def stdlib_files(root: Path | None = None) -> list[tuple[str, Path]]:
    """(relative key, path) of every stdlib .py file outside test folders, sorted by key."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDED_DIRS and not d.startswith("test_"))
        for name in filenames:
            if name.endswith(".py") and not name.startswith("test_"):
                path = Path(dirpath) / name
                found.append((path.relative_to(root).as_posix(), path))
    return sorted(found)


def expand_globs(patterns: list[str]) -> list[tuple[str, Path]]:
    found: dict[str, Path] = {}
    for pattern in patterns:
        matches = sorted(glob.glob(os.path.expanduser(pattern), recursive=True))
        if not matches:
            raise DataError(f"data.paths: {pattern!r} matches no file")
        for match in matches:
            path = Path(match)
            if path.is_file():
                found[path.as_posix()] = path
    return sorted(found.items())


@dataclass
class Corpus:
    """Train and validation token streams (1-D integer arrays)."""

    train: np.ndarray
    val: np.ndarray
    description: str


def _split_by_hash(files: list[tuple[str, Path]], val_percent: float) -> tuple[list[Path], list[Path]]:
    train = [p for key, p in files if not is_validation_path(key, val_percent)]
    val = [p for key, p in files if is_validation_path(key, val_percent)]
    return train, val


def _read_text_files(paths: list[Path]) -> np.ndarray:
    chunks = []
    for path in paths:
        chunks.append(path.read_bytes())
        chunks.append(DOCUMENT_SEPARATOR)
    return np.frombuffer(b"".join(chunks), dtype=np.uint8)


def _tail_split(tokens: np.ndarray, val_percent: float) -> tuple[np.ndarray, np.ndarray]:
    cut = int(len(tokens) * (1 - val_percent / 100))
    return tokens[:cut], tokens[cut:]


def _load_tokens(paths: list[Path], dtype: str) -> np.ndarray:
    arrays = [np.memmap(p, dtype=dtype, mode="r") for p in paths]
    if not arrays:
        return np.empty(0, dtype=dtype)
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def _load_prepared(directory: Path, val_percent: float) -> Corpus:
    """A `noloco-rt prepare` directory: its own train and val shards, in its dtype."""
    manifest = read_manifest(directory)
    try:
        train, val = (_load_tokens(manifest.train, manifest.token_dtype),
                      _load_tokens(manifest.val, manifest.token_dtype))
    except (OSError, ValueError) as exc:
        raise DataError(f"{directory}: cannot read its shards ({exc})") from None
    if not len(train) or not len(val):  # too few documents for the split: hold out the tail
        train, val = _tail_split(np.concatenate([train, val]), val_percent)
    description = f"prepared {directory} ({len(manifest.train)}+{len(manifest.val)} shards)"
    return Corpus(train=train, val=val, description=description)


def _check_token_ids(corpus: Corpus, vocab_size: int) -> Corpus:
    for name, stream in (("train", corpus.train), ("validation", corpus.val)):
        top = int(stream.max()) if len(stream) else 0
        if top >= vocab_size:
            raise DataError(f"{name} tokens reach id {top}, but model.vocab_size is {vocab_size}")
    return corpus


def load_corpus(cfg: DataConfig, *, vocab_size: int = BYTE_VOCAB_SIZE, stdlib_root: Path | None = None) -> Corpus:
    if cfg.source == "tokens":
        directory = find_prepared_dir(cfg.paths)
        if directory is not None:
            return _check_token_ids(_load_prepared(directory, cfg.val_percent), vocab_size)
    if cfg.source == "stdlib":
        files = stdlib_files(stdlib_root)
        if not files:
            raise DataError(f"no standard library sources found under {stdlib_root or sysconfig.get_paths()['stdlib']}")
        description = f"stdlib ({len(files)} files)"
    else:
        files = expand_globs(cfg.paths)
        if not files:
            raise DataError(f"data.paths {cfg.paths!r} names no regular file")
        description = f"{cfg.source} ({len(files)} files)"
    train_paths, val_paths = _split_by_hash(files, cfg.val_percent)
    read = _read_text_files if cfg.source != "tokens" else (lambda ps: _load_tokens(ps, cfg.token_dtype))
    if train_paths and val_paths:
        train, val = read(train_paths), read(val_paths)
    else:  # too few files for a hash split: hold out the tail of the stream
        train, val = _tail_split(read([p for _, p in files]), cfg.val_percent)
    if cfg.source == "tokens":
        return _check_token_ids(Corpus(train=train, val=val, description=description), vocab_size)
    if vocab_size < BYTE_VOCAB_SIZE:
        raise DataError(f"text sources use byte tokens (0..255); model.vocab_size {vocab_size} is too small")
    return Corpus(train=train, val=val, description=description)


@dataclass
class DataCursor:
    """Where a shard's stream stands: enough for a checkpoint to resume it exactly."""

    epoch: int = 0
    position: int = 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    @classmethod
    def from_state_dict(cls, state: dict[str, int]) -> DataCursor:
        """The cursor a state dict holds; ValueError unless both are non-negative integers (a
        cursor may come from the durable store, which is read like a wire message)."""
        epoch, position = state["epoch"], state["position"]
        for name, value in (("epoch", epoch), ("position", position)):
            if not is_count(value):
                raise ValueError(f"data cursor {name} = {value!r} is not a non-negative integer")
        return cls(epoch=epoch, position=position)


class ShardedBatches:
    """Microbatches of (inputs, targets), each (B, T), for shard `shard` of `num_shards`.

    The stream is cut into windows of T+1 tokens at stride T; every epoch shuffles
    the window order with (seed, epoch), and shard k takes every num_shards-th window
    from offset k. Shards never overlap within an epoch and the order depends on
    nothing but (seed, epoch, shard, num_shards), so a cursor resumes it exactly.
    """

    def __init__(self, tokens: np.ndarray, *, seq_len: int, batch_size: int, shard: int, num_shards: int,
                 seed: int, cursor: DataCursor | None = None) -> None:
        if not 0 <= shard < num_shards:
            raise ValueError(f"shard must be in [0, {num_shards}), got {shard}")
        self.tokens = tokens
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.shard = shard
        self.num_shards = num_shards
        self.seed = seed
        self.num_windows = (len(tokens) - 1) // seq_len
        if self.num_windows // num_shards < batch_size:
            raise DataError(f"{len(tokens)} tokens give {self.num_windows} windows of {seq_len + 1} tokens: "
                            f"too few for {num_shards} shards of batch size {batch_size}")
        self.cursor = cursor or DataCursor()
        self._order_epoch = -1
        self._order = np.empty(0, dtype=np.int64)

    def _shard_order(self, epoch: int) -> np.ndarray:
        if epoch != self._order_epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._order = rng.permutation(self.num_windows)[self.shard::self.num_shards]
            self._order_epoch = epoch
        return self._order

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        order = self._shard_order(self.cursor.epoch)
        if self.cursor.position + self.batch_size > len(order):
            self.cursor = DataCursor(epoch=self.cursor.epoch + 1, position=0)
            order = self._shard_order(self.cursor.epoch)
        starts = order[self.cursor.position:self.cursor.position + self.batch_size] * self.seq_len
        self.cursor = DataCursor(epoch=self.cursor.epoch, position=self.cursor.position + self.batch_size)
        windows = np.stack([np.asarray(self.tokens[s:s + self.seq_len + 1], dtype=np.int64) for s in starts])
        batch = torch.from_numpy(windows)  # (B, T+1)
        return batch[:, :-1], batch[:, 1:]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield self.next_batch()


def validation_capacity(tokens: np.ndarray, *, seq_len: int, batch_size: int) -> int:
    """Batches of distinct windows the validation stream holds (more would repeat windows)."""
    return ((len(tokens) - 1) // seq_len) // batch_size


def validation_batches(tokens: np.ndarray, *, seq_len: int, batch_size: int,
                       count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A fixed set of validation batches, evenly spaced over the stream (same for every caller)."""
    num_windows = (len(tokens) - 1) // seq_len
    needed = count * batch_size
    if num_windows < 1:
        raise DataError(f"validation stream of {len(tokens)} tokens is shorter than one sequence")
    starts = (np.linspace(0, num_windows - 1, needed).astype(np.int64)) * seq_len
    windows = torch.from_numpy(np.stack([np.asarray(tokens[s:s + seq_len + 1], dtype=np.int64) for s in starts]))
    return [(w[:, :-1], w[:, 1:]) for w in windows.split(batch_size)]
