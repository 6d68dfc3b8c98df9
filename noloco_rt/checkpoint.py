"""Crash-safe worker checkpoints: write to a temporary file, fsync, rename, fsync the folder.

A reader therefore sees either the previous complete checkpoint or the new complete
one, never a torn file, whatever moment the writer is killed at.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

CHECKPOINT_VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint exists but cannot be used (corrupt, other run or stage, other version)."""


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """state: tensors, lists of tensors, numbers, strings and dicts of those."""
    import io

    buffer = io.BytesIO()
    torch.save({"version": CHECKPOINT_VERSION, **state}, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def load_checkpoint(path: Path, *, run_id: str, stage: int) -> dict[str, Any] | None:
    """The checkpoint at `path`, or None if there is none. Raises CheckpointError when it
    exists but belongs to another run or stage, or cannot be read."""
    if not path.exists():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a damaged file
        raise CheckpointError(f"checkpoint {path} cannot be read: {exc}") from exc
    if state.get("version") != CHECKPOINT_VERSION:
        raise CheckpointError(f"checkpoint {path} has version {state.get('version')}, expected {CHECKPOINT_VERSION}")
    if state.get("run_id") != run_id or state.get("stage") != stage:
        raise CheckpointError(f"checkpoint {path} is for run {state.get('run_id')!r} stage {state.get('stage')}, "
                              f"not run {run_id!r} stage {stage}")
    return state
