from __future__ import annotations

import pytest
import torch

from noloco_rt.checkpoint import (
    CheckpointError,
    atomic_write_bytes,
    load_checkpoint,
    save_checkpoint,
)


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
