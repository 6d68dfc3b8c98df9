"""A worker's own checkpoint writes (workers/checkpoint_writes.py, noloco_rt/checkpoints/kept.py):
off the training thread, one at a time, the last N kept, resumed from an older one when the
newest cannot be read, and a failed write (a full disk) counted while the last good
checkpoint stays. Real files and threads; failures come from the real write call."""

from __future__ import annotations

import errno
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._pytree import tree_flatten

from noloco_rt.algo.replica import StageReplica
from noloco_rt.checkpoints.kept import kept_paths, load_newest_usable, older_index, write_kept
from noloco_rt.checkpoints.worker import CheckpointError, load_checkpoint
from noloco_rt.config import ConfigError, load_config
from noloco_rt.store.backend import RunStore
from tests.support.waiting import wait_until
from workers.checkpoint_writes import CheckpointWrites, checkpoint_due, failure_kind
from workers.counters import Counters
from workers.device import arena_bytes
from workers.durable_state import DurableStageState
from workers.faults.checkpoint_writes import DiskFullAfter, disk_full_from_env
from workers.lifecycle import WorkerCheckpoint
from workers.metrics import WorkerMetrics

pytestmark = pytest.mark.timeout(60)


class RecordingLog:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def info(self, event: str, **fields: Any) -> None:
        self.lines.append(("info", event, fields))

    def warning(self, event: str, **fields: Any) -> None:
        self.lines.append(("warning", event, fields))

    def events(self, event: str) -> list[dict[str, Any]]:
        return [fields for _, name, fields in list(self.lines) if name == event]


def _state(step: int) -> dict[str, Any]:
    return {"run_id": "r", "stage": 0, "slow": [torch.full((4,), float(step))], "counters": {"outer_steps": step}}


def _step_on_disk(path: Path) -> int:
    return int(load_checkpoint(path, run_id="r", stage=0)["counters"]["outer_steps"])


def _temporaries(folder: Path) -> list[Path]:
    return sorted(folder.glob(".*.tmp"))


# -- the cadence and the failure kinds (pure) -------------------------------------------------

def test_a_checkpoint_is_due_by_outer_step_count_or_by_time():
    assert checkpoint_due(4, every=2, interval_s=0, since_write_s=0)
    assert not checkpoint_due(5, every=2, interval_s=0, since_write_s=10_000)  # time cadence off
    assert checkpoint_due(5, every=2, interval_s=60, since_write_s=60)
    assert not checkpoint_due(5, every=2, interval_s=60, since_write_s=59.9)
    assert checkpoint_due(7, every=0, interval_s=60, since_write_s=61)  # no count, time only
    assert not checkpoint_due(8, every=0, interval_s=0, since_write_s=1e9)


def test_a_failure_is_counted_by_its_errno_name():
    assert failure_kind(OSError(errno.ENOSPC, "No space left on device")) == "ENOSPC"
    assert failure_kind(PermissionError(errno.EACCES, "Permission denied")) == "EACCES"
    assert failure_kind(OSError("no errno")) == "OSError"
    assert failure_kind(RuntimeError("pickling")) == "RuntimeError"


@pytest.mark.parametrize(("field", "value"), [("checkpoint_interval_s", -1.0), ("checkpoint_interval_s", float("nan")),
                                              ("checkpoint_keep", 0)])
def test_bad_checkpoint_settings_name_their_field(field, value):
    with pytest.raises(ConfigError, match=f"worker.{field}"):
        load_config(environ={}, overrides=[{"worker": {field: value}}])


# -- keep the last N ------------------------------------------------------------------------

def test_the_last_n_are_kept_newest_at_the_usual_path_and_only_it_ends_in_pt(tmp_path):
    path = tmp_path / "w.pt"
    assert [p.name for p in kept_paths(path, 3)] == ["w.pt", "w.pt.1", "w.pt.2"]
    for step in range(1, 5):
        write_kept(path, _checkpoint_bytes(step), keep=3)
    assert [_step_on_disk(p) for p in kept_paths(path, 3)] == [4, 3, 2]
    assert not (tmp_path / "w.pt.3").exists()  # the oldest beyond 3 is gone
    assert [p.name for p in tmp_path.glob("*.pt")] == ["w.pt"]  # export and the chaos driver see one file
    assert _temporaries(tmp_path) == []
    write_kept(path, _checkpoint_bytes(5), keep=1)  # keep lowered: older files go once the new one is complete
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.pt"] and _step_on_disk(path) == 5
    assert older_index(path, tmp_path / "w.pt.12") == 12 and older_index(path, tmp_path / "w.pt.x") is None
    assert older_index(path, tmp_path / "w.pt") is None and older_index(path, tmp_path / "v.pt.1") is None


def _checkpoint_bytes(step: int) -> bytes:
    from noloco_rt.checkpoints.worker import checkpoint_bytes

    return checkpoint_bytes(_state(step))


def test_an_unreadable_newest_falls_back_to_the_next_kept_one(tmp_path):
    path = tmp_path / "w.pt"
    for step in (1, 2):
        write_kept(path, _checkpoint_bytes(step), keep=2)
    path.write_bytes(b"torn by a disk error")
    state, used, passed_over = load_newest_usable(path, keep=2, run_id="r", stage=0)
    assert used == tmp_path / "w.pt.1" and state["counters"]["outer_steps"] == 1
    assert len(passed_over) == 1 and "cannot be read" in passed_over[0]
    (tmp_path / "w.pt.1").write_bytes(b"also damaged")
    with pytest.raises(CheckpointError, match="w.pt cannot be read"):  # none usable: never silently dropped
        load_newest_usable(path, keep=2, run_id="r", stage=0)
    assert load_newest_usable(tmp_path / "absent.pt", keep=2, run_id="r", stage=0) == (None, None, [])


def test_a_worker_resumes_from_its_older_checkpoint_when_the_newest_is_damaged(tmp_path):
    cfg = load_config(environ={})
    log = RecordingLog()
    replica, counters = StageReplica.create(cfg, 0), Counters()
    writes = CheckpointWrites(tmp_path / "w.pt", keep=2, log=log)
    checkpoint = WorkerCheckpoint(tmp_path / "w.pt", run_id="default", stage=0, name="w", replica=replica,
                                  counters=counters, cursor_state=lambda: None, h=5, log=log, writes=writes)
    counters.set_steps(10, 2, h=5)
    assert checkpoint.save("periodic")
    at_step_two = [t.clone() for t in replica.slow]
    with torch.no_grad():
        for tensor in replica.slow:
            tensor.add_(1.0)
    counters.set_steps(15, 3, h=5)
    assert checkpoint.save("periodic")
    (tmp_path / "w.pt").write_bytes(b"\0" * 64)  # the newest lost to a disk error

    restarted, restored = StageReplica.create(cfg, 0), Counters()
    again = WorkerCheckpoint(tmp_path / "w.pt", run_id="default", stage=0, name="w", replica=restarted,
                             counters=restored, cursor_state=lambda: None, h=5, log=log,
                             writes=CheckpointWrites(tmp_path / "w.pt", keep=2, log=log))
    assert again.resume()[0] and (restored.inner_steps, restored.outer_steps) == (10, 2)
    assert all(torch.equal(mine, saved) for mine, saved in zip(restarted.slow, at_step_two, strict=True))
    [warning] = log.events("checkpoint_passed_over")
    assert "cannot be read" in warning["reason"]
    assert log.events("resumed_checkpoint")[-1]["path"] == str(tmp_path / "w.pt.1")
    writes.close()


# -- off the training thread -------------------------------------------------------------------

class HeldWrite:
    """A slow disk: a write waits inside the real write call until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self) -> None:
        self.entered.set()
        if not self.release.wait(30):
            raise AssertionError("the held write was never released")


def test_a_background_write_copies_the_state_and_a_second_one_while_busy_is_skipped(tmp_path):
    log, held = RecordingLog(), HeldWrite()
    writes = CheckpointWrites(tmp_path / "w.pt", keep=1, log=log, fault=held)
    live = _state(1)
    assert writes.in_background(lambda: live, reason="periodic", outer_step=1, inner_step=5)
    assert held.entered.wait(10)  # the writer thread is inside the write
    live["slow"][0].add_(100.0)  # training goes on: the copy being written must not change
    assert not writes.in_background(lambda: _state(2), reason="periodic", outer_step=2, inner_step=10)
    assert writes.counts()["skipped_busy"] == 1 and log.events("checkpoint_skipped")[0]["outer_step"] == 2
    held.release.set()
    wait_until(lambda: writes.written == 1, timeout_s=10, what="the background write")
    assert torch.equal(load_checkpoint(tmp_path / "w.pt", run_id="r", stage=0)["slow"][0], torch.full((4,), 1.0))
    assert writes.last_written == (1, 5) and log.events("checkpoint_written")[0]["outer_step"] == 1
    assert writes.in_background(lambda: _state(3), reason="periodic", outer_step=3, inner_step=15)  # idle again
    wait_until(lambda: writes.written == 2, timeout_s=10, what="the next background write")
    assert _step_on_disk(tmp_path / "w.pt") == 3
    writes.close()


def test_the_final_write_waits_for_the_one_in_flight(tmp_path):
    log, held = RecordingLog(), HeldWrite()
    writes = CheckpointWrites(tmp_path / "w.pt", keep=1, log=log, fault=held)
    assert writes.in_background(lambda: _state(1), reason="periodic", outer_step=1, inner_step=5)
    assert held.entered.wait(10)
    final = threading.Thread(target=writes.now, args=(_state(2),),
                             kwargs={"reason": "leave", "outer_step": 2, "inner_step": 10})
    final.start()
    held.release.set()
    final.join(30)
    assert not final.is_alive()
    assert [e["reason"] for e in log.events("checkpoint_written")] == ["periodic", "leave"]  # in that order
    assert _step_on_disk(tmp_path / "w.pt") == 2 and log.events("checkpoint_superseded") == []
    writes.close()


def test_an_older_write_never_replaces_the_final_one(tmp_path):
    log = RecordingLog()
    writes = CheckpointWrites(tmp_path / "w.pt", keep=1, log=log)
    assert writes.now(_state(5), reason="finished", outer_step=5, inner_step=25)
    assert writes.in_background(lambda: _state(4), reason="periodic", outer_step=4, inner_step=20)
    assert writes.writer.wait_idle(10)
    assert _step_on_disk(tmp_path / "w.pt") == 5 and writes.written == 1
    assert log.events("checkpoint_superseded")[0]["outer_step"] == 4
    writes.close()


# -- a failed write is counted and survived ------------------------------------------------------

def test_a_full_disk_is_counted_and_the_last_good_checkpoint_stays(tmp_path):
    log, metrics = RecordingLog(), WorkerMetrics()
    folder = tmp_path / "ckpt"
    writes = CheckpointWrites(folder / "w.pt", keep=2, log=log, failures_metric=metrics.checkpoint_failures,
                              fault=DiskFullAfter(writes_ok=1))
    assert writes.now(_state(1), reason="periodic", outer_step=1, inner_step=5)
    assert not writes.now(_state(2), reason="periodic", outer_step=2, inner_step=10)  # in the caller's thread
    assert writes.in_background(lambda: _state(3), reason="periodic", outer_step=3, inner_step=15)
    wait_until(lambda: writes.failed_total() == 2, timeout_s=10, what="the failed background write")
    assert _step_on_disk(folder / "w.pt") == 1 and not (folder / "w.pt.1").exists()  # nothing rotated away
    assert _temporaries(folder) == []  # each failed write removed its temporary
    assert writes.counts() == {"written": 1, "failed": {"ENOSPC": 2}, "skipped_busy": 0}
    assert metrics.registry.get_sample_value("noloco_checkpoint_failures_total", {"kind": "ENOSPC"}) == 2
    failed = log.events("checkpoint_failed")
    assert [f["outer_step"] for f in failed] == [2, 3] and failed[0]["kind"] == "ENOSPC"
    assert failed[0]["error"] == "No space left on device" and failed[0]["last_good"] == [1, 5]
    assert writes.writer.wait_idle(10) and writes.in_background(  # the writer thread survived
        lambda: _state(4), reason="periodic", outer_step=4, inner_step=20)
    wait_until(lambda: writes.failed_total() == 3, timeout_s=10, what="a third failed write")
    writes.close()


def test_a_folder_that_cannot_be_written_is_a_counted_failure_too(tmp_path):
    log = RecordingLog()
    (tmp_path / "not-a-folder").write_text("a file where the checkpoint folder should be")
    writes = CheckpointWrites(tmp_path / "not-a-folder" / "w.pt", keep=1, log=log)
    assert writes.in_background(lambda: _state(1), reason="periodic", outer_step=1, inner_step=5)
    wait_until(lambda: writes.failed_total() == 1, timeout_s=10, what="the failed write")
    assert set(writes.counts()["failed"]) <= {"EEXIST", "ENOTDIR"}
    writes.close()


def test_the_disk_full_knob_lets_the_first_writes_through():
    assert disk_full_from_env({}) is None
    fault = disk_full_from_env({"CHAOS_CHECKPOINT_DISK_FULL_AFTER": "2"})
    fault()
    fault()
    with pytest.raises(OSError) as raised:
        fault()
    assert raised.value.errno == errno.ENOSPC
    with pytest.raises(ValueError, match="must be >= 0"):
        DiskFullAfter(-1)


def test_the_durable_store_counts_a_failed_write_and_its_writer_goes_on(tmp_path):
    log = RecordingLog()
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "r").write_text("a file where the run's folder should be: every write fails")
    durable = DurableStageState(RunStore(str(tmp_path / "store")), run_id="r", stage=0, worker_id="a", name="w",
                                every=1, keep=2, log=log)
    durable.after_outer_step(1, 5, state=lambda: _state(1), cursor=None, live_peer_ids=[])
    wait_until(lambda: durable.failed == 1, timeout_s=10, what="the failed store write")
    assert durable.writer.wait_idle(10)
    assert log.events("store_write_failed")[0]["error_type"] in ("FileExistsError", "NotADirectoryError")
    (tmp_path / "store" / "r").unlink()  # space again: the next write lands
    durable.after_outer_step(2, 10, state=lambda: _state(2), cursor=None, live_peer_ids=[])
    wait_until(lambda: durable.written == 1, timeout_s=10, what="the store write after the failure")
    assert durable.latest().info.outer_step == 2
    durable.write_now(3, 15, state=_state(3), cursor=None, wait_s=10)  # finishing: in this thread
    assert durable.counts() == {"written": 2, "failed": 1, "skipped_busy": 0}


def test_what_sparse_rounds_left_unsent_is_checkpointed_and_restored_by_its_own_worker_only(tmp_path):
    cfg = load_config(environ={})
    log = RecordingLog()
    replica, counters = StageReplica.create(cfg, 0), Counters()
    replica.error_feedback.residual = [torch.full_like(t, 0.25) for t in replica.slow]
    checkpoint = WorkerCheckpoint(tmp_path / "w.pt", run_id="default", stage=0, name="w", replica=replica,
                                  counters=counters, cursor_state=lambda: None, h=5, log=log)
    assert checkpoint.save("periodic")

    def restored_residual(name: str) -> list[torch.Tensor] | None:
        restarted = StageReplica.create(cfg, 0)
        WorkerCheckpoint(tmp_path / f"{name}.pt", run_id="default", stage=0, name=name, replica=restarted,
                         counters=Counters(), cursor_state=lambda: None, h=5, log=log).apply(checkpoint.snapshot())
        return restarted.error_feedback.residual

    mine = restored_residual("w")
    assert mine is not None and all(torch.equal(r, torch.full_like(r, 0.25)) for r in mine)
    assert restored_residual("another") is None  # a replica resuming the stage's store copy starts empty
    checkpoint.writes.close()


def test_the_pinned_bytes_counted_at_start_up_are_those_of_the_state_after_the_first_inner_step(tmp_path):
    # Reserved before training (on CUDA), the arena must already fit the state the first
    # checkpoint copies, AdamW's moments and step counts included, or it is pinned again then.
    cfg = load_config(environ={}, overrides=[{"pipeline": {"stages": 2}}])
    log = RecordingLog()
    replica = StageReplica.create(cfg, 1)
    checkpoint = WorkerCheckpoint(tmp_path / "w.pt", run_id="default", stage=1, name="w", replica=replica,
                                  counters=Counters(), cursor_state=lambda: None, h=5, log=log,
                                  writes=CheckpointWrites(tmp_path / "w.pt", keep=1, log=log))
    at_start = checkpoint.pinned_state_bytes()
    hidden = torch.randn(2, 8, replica.module.shape.dim)
    replica.module(hidden).square().mean().backward()
    replica.inner.step()
    leaves, _ = tree_flatten(checkpoint.state_dict())
    tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
    assert len(tensors) > 5 * len(replica.inner.params)  # θ, φ, δ, two moments and a step each
    assert at_start == arena_bytes(t.numel() * t.element_size() for t in tensors)
    assert checkpoint.pinned_state_bytes() == at_start  # the moments now exist: counted once
    assert not checkpoint.writes.reserve_pinned(at_start)  # the CPU pins nothing
    checkpoint.writes.close()
