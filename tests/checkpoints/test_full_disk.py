"""The chaos run's full disk on a real tmpfs: full for the whole hold, whatever a writer frees."""

from __future__ import annotations

import errno
import time

import pytest

from workers.cluster.chaos_faults import DISK_FULL_UNSEEN_MAX_S, FullDisk, HeldClusterFault


@pytest.fixture
def disk(tmp_path):
    if why_not := FullDisk.unavailable():
        pytest.skip(reason=f"no tmpfs here ({why_not}): the full disk needs root to mount one")
    full = FullDisk(tmp_path / "checkpoints", size_mb=8)
    full.mount()
    try:
        yield full
    finally:
        full.unmount_keeping_files()


def write_fails_with_enospc(path) -> bool:
    try:
        path.write_bytes(b"\1" * 1000)  # far less than a page-aligned checkpoint: any room would do
    except OSError as exc:
        return exc.errno == errno.ENOSPC
    path.unlink()
    return False


def test_a_full_disk_stays_full_through_its_hold_though_a_file_is_deleted(disk):
    """A checkpoint write in flight when the disk filled completes and drops its oldest file:
    that room is taken back at the next tick, so the writes after it still fail."""
    older = disk.folder / "s0-r0.pt.1"
    older.write_bytes(b"\1" * (1 << 20))
    held = HeldClusterFault({}, None, disk, seed=0)
    record = {"kind": "disk_full"}
    held.fill(hold_s=60.0, record=record, now=time.monotonic())
    assert record["filled_bytes"] > 6 * (1 << 20)
    assert write_fails_with_enospc(disk.folder / "probe")  # not even a page left
    older.unlink()  # the rotation of a write that was in flight
    held.undo_due(time.monotonic())  # a driver tick during the hold
    assert record["refilled_bytes"] >= 1 << 20
    assert write_fails_with_enospc(disk.folder / "probe")
    held.undo_due(time.monotonic() + 61.0)  # the hold is over: freed
    assert "resumed_wall" in record and not write_fails_with_enospc(disk.folder / "probe")


def test_a_full_disk_no_write_has_met_stays_full_past_its_hold_up_to_a_bound(disk):
    """A loaded machine can go longer than a short hold between checkpoints: the disk is freed
    once a write failed on it, or at the bound, never before either."""
    held = HeldClusterFault({}, None, disk, seed=0)
    record = {"kind": "disk_full"}
    start = time.monotonic()
    held.fill(hold_s=2.0, record=record, now=start)
    held.undo_due(start + 3.0, write_failed=False)  # the hold is over, but no write met it
    assert held.active and write_fails_with_enospc(disk.folder / "probe")
    held.undo_due(start + 3.0, write_failed=True)  # a worker's write failed: freed now
    assert not held.active and not write_fails_with_enospc(disk.folder / "probe")
    record = {"kind": "disk_full"}
    held.fill(hold_s=2.0, record=record, now=start)
    held.undo_due(start + 2.0 + DISK_FULL_UNSEEN_MAX_S, write_failed=False)  # nobody wrote: freed at the bound
    assert "resumed_wall" in record and not write_fails_with_enospc(disk.folder / "probe")
