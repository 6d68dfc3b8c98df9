from __future__ import annotations

import errno
import io
from pathlib import Path

import pytest
import torch

from noloco_rt.checkpoints.worker import (
    CheckpointError,
    atomic_write_bytes,
    checkpoint_bytes,
    checkpoint_writer,
    load_checkpoint,
    save_checkpoint,
)

FULL_DEVICE = Path("/dev/full")
"""Linux's always-full device (the project runs on Linux: CI, the image): every write to it
fails with ENOSPC."""


def test_round_trip(tmp_path):
    path = tmp_path / "ckpt" / "worker.pt"
    state = {"run_id": "r", "stage": 1, "slow": [torch.randn(3)], "counters": {"outer_step": 4}}
    save_checkpoint(path, state)
    loaded = load_checkpoint(path, run_id="r", stage=1)
    assert torch.equal(loaded["slow"][0], state["slow"][0]) and loaded["counters"] == {"outer_step": 4}
    assert [p.name for p in path.parent.iterdir()] == ["worker.pt"]  # no temporary left behind


def test_missing_is_none_and_foreign_is_an_error(tmp_path):
    path = tmp_path / "w.pt"
    assert load_checkpoint(path, run_id="r", stage=0) is None
    save_checkpoint(path, {"run_id": "other", "stage": 0})
    with pytest.raises(CheckpointError, match="run 'other'"):
        load_checkpoint(path, run_id="r", stage=0)
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="cannot be read"):
        load_checkpoint(path, run_id="r", stage=0)


def test_atomic_write_replaces_whole_file(tmp_path):
    path = tmp_path / "f"
    atomic_write_bytes(path, b"a" * 1000)
    atomic_write_bytes(path, b"b")
    assert path.read_bytes() == b"b"


def test_the_file_writer_writes_what_checkpoint_bytes_holds(tmp_path):
    """Written by torch.save straight into the file, the checkpoint reads back as the bytes
    (what the durable store uploads) do."""
    state = {"run_id": "r", "stage": 0, "fast": [torch.randn(4, 3), torch.randn(7)], "cursor": {"epoch": 2}}
    path = tmp_path / "w.pt"
    checkpoint_writer(state)(path)
    from_file = load_checkpoint(path, run_id="r", stage=0)
    from_bytes = torch.load(io.BytesIO(checkpoint_bytes(state)), weights_only=True)
    assert from_file.keys() == from_bytes.keys() and from_file["cursor"] == {"epoch": 2}
    for written, expected in zip(from_file["fast"], state["fast"], strict=True):
        assert torch.equal(written, expected)


def test_a_full_disk_is_an_oserror_with_its_errno():
    """torch.save reports a failed write as a RuntimeError without errno; the writer raises the
    OSError itself, so a full disk is counted as ENOSPC (workers/checkpoint_writes.py)."""
    with pytest.raises(OSError) as raised:
        checkpoint_writer({"run_id": "r", "stage": 0, "fast": [torch.randn(100_000)]})(FULL_DEVICE)
    assert raised.value.errno == errno.ENOSPC
