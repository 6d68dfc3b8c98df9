"""The durable store: a folder and an fsspec URL, checksummed stage checkpoints, data cursors,
the writer election and the transfer timeouts (all pure or local: no processes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid

import pytest
import torch

from noloco_rt.config import WorkerConfig
from noloco_rt.data import DataCursor
from noloco_rt.store.backend import RunStore, StoreError
from noloco_rt.store.cursors import DataCursors
from noloco_rt.store.stage_checkpoints import StageCheckpoints, beyond_keep, final_states
from noloco_rt.transfer_time import stage_timeouts, transfer_s
from workers.durable_state import detached_copy, is_elected_writer


def _state(value: float) -> dict:
    return {"slow": [torch.full((3, 2), value)], "counters": {"inner_steps": int(value * 10), "outer_steps": 1},
            "cursor": {"epoch": 0, "position": int(value)}}


@pytest.fixture(params=["folder", "memory"])
def store(request, tmp_path) -> RunStore:
    # memory:// is fsspec's in-memory filesystem: the same code path as s3:// or gs://.
    return RunStore(str(tmp_path / "store") if request.param == "folder" else f"memory://{uuid.uuid4().hex}")


def test_the_newest_checkpoint_comes_back_with_its_manifest(store):
    checkpoints = StageCheckpoints(store, "run-a", keep=2)
    assert checkpoints.latest(1) == (None, [])
    checkpoints.save(1, _state(1.0), outer_step=5, inner_step=25, writer="aaaa1111")
    info = checkpoints.save(1, _state(2.0), outer_step=10, inner_step=50, writer="bbbb2222")
    loaded, problems = checkpoints.latest(1)
    assert problems == [] and loaded.info == info
    assert torch.equal(loaded.state["slow"][0], torch.full((3, 2), 2.0))
    assert loaded.state["run_id"] == "run-a" and loaded.state["stage"] == 1
    assert StageCheckpoints(store, "run-b").latest(1) == (None, [])  # another run sees nothing


def test_a_damaged_checkpoint_is_passed_over_for_the_one_before(store):
    checkpoints = StageCheckpoints(store, "run", keep=3)
    checkpoints.save(0, _state(1.0), outer_step=5, inner_step=25, writer="w1")
    newer = checkpoints.save(0, _state(2.0), outer_step=10, inner_step=50, writer="w1")
    path = f"run/stage-0/{newer.data_file}"
    data = bytearray(store.read(path))
    data[len(data) // 2] ^= 0xFF
    store.write(path, bytes(data))
    loaded, problems = checkpoints.latest(0)
    assert loaded.info.outer_step == 5
    assert len(problems) == 1 and "fails its checksum" in problems[0]


def test_a_checkpoint_without_its_manifest_does_not_exist(store):
    checkpoints = StageCheckpoints(store, "run")
    store.write("run/stage-0/step-00000099-dead.pt", b"a writer killed before its manifest")
    assert checkpoints.latest(0) == (None, [])
    store.write("run/stage-0/step-00000099-dead.json", b"{not json")
    loaded, problems = checkpoints.latest(0)
    assert loaded is None and "not valid" in problems[0]


def test_two_writers_of_one_step_keep_their_own_files_and_old_ones_are_pruned(store):
    checkpoints = StageCheckpoints(store, "run", keep=2)
    for step in (5, 10):
        for writer in ("aaaa", "bbbb"):
            checkpoints.save(2, _state(step), outer_step=step, inner_step=step * 5, writer=writer)
    checkpoints.save(2, _state(15), outer_step=15, inner_step=75, writer="aaaa")
    infos, _ = checkpoints.manifests(2)
    # The newest two outer steps are kept, every writer's (a stage's replicas all write their final state).
    assert [(i.outer_step, i.writer) for i in infos] == [(15, "aaaa"), (10, "bbbb"), (10, "aaaa")]
    assert sorted(store.list("run/stage-2")) == ["step-00000010-aaaa.json", "step-00000010-aaaa.pt",
                                                 "step-00000010-bbbb.json", "step-00000010-bbbb.pt",
                                                 "step-00000015-aaaa.json", "step-00000015-aaaa.pt"]
    assert beyond_keep(infos, 1) == infos[1:]
    assert [i.writer for i in final_states(infos[1:])] == ["bbbb", "aaaa"]


def test_data_cursors_are_kept_by_name(store):
    cursors = DataCursors(store, "run")
    assert cursors.load("stage0-r1") is None
    cursors.save("stage0-r1", {"epoch": 2, "position": 17}, inner_step=90)
    cursors.save("stage0-r1", {"epoch": 2, "position": 18}, inner_step=95)
    assert cursors.load("stage0-r1") == DataCursor(epoch=2, position=18)
    assert cursors.load("stage0-r2") is None


def test_a_store_that_cannot_be_opened_says_why():
    with pytest.raises(StoreError, match="nosuchproto"):
        RunStore("nosuchproto://bucket/prefix")
    with pytest.raises(StoreError, match="empty"):
        RunStore("")


def test_a_folder_write_killed_midway_leaves_the_previous_checkpoint_readable(tmp_path):
    store = RunStore(str(tmp_path))
    StageCheckpoints(store, "run").save(0, _state(1.0), outer_step=5, inner_step=25, writer="w1")
    # A writer process SIGKILLed while it writes a larger, newer checkpoint.
    script = ("import sys, torch; from noloco_rt.store.backend import RunStore;"
              "from noloco_rt.store.stage_checkpoints import StageCheckpoints;"
              "import noloco_rt.checkpoints.worker as c; orig = c.os.replace;"
              "c.os.replace = lambda *a: (print('renaming', flush=True), sys.stdin.readline(), orig(*a));"
              f"StageCheckpoints(RunStore({str(tmp_path)!r}), 'run').save(0, "
              "{'slow': [torch.ones(1000, 1000)]}, outer_step=10, inner_step=50, writer='w2')")
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert child.stdout.readline().strip() == "renaming"  # the data file is written, not yet renamed
    child.send_signal(signal.SIGKILL)
    child.wait(30)
    loaded, problems = StageCheckpoints(store, "run").latest(0)
    assert loaded.info.outer_step == 5 and problems == []


def test_the_stage_writer_is_the_smallest_live_id():
    assert is_elected_writer("a1", ["b2", "c3"])
    assert not is_elected_writer("b2", ["a1", "c3"])
    assert is_elected_writer("b2", [])  # alone


def test_a_detached_copy_does_not_change_with_the_original():
    original = {"slow": [torch.zeros(4)], "inner": {"state": {0: {"exp_avg": torch.zeros(4)}}}, "n": 3}
    copy = detached_copy(original)
    original["slow"][0].add_(1)
    original["inner"]["state"][0]["exp_avg"].add_(1)
    assert copy["slow"][0].sum() == 0 and copy["inner"]["state"][0]["exp_avg"].sum() == 0 and copy["n"] == 3


def test_a_state_copied_to_the_host_does_not_change_with_the_original_on_any_device():
    from workers.background_writer import state_to_host
    from workers.device import HostStaging, PinnedArena

    original = {"slow": [torch.zeros(4)], "inner": {"state": {0: {"exp_avg": torch.zeros(4)}}}, "n": 3}
    copy = state_to_host(original, HostStaging(torch.device("cpu")), PinnedArena(1 << 20))
    original["slow"][0].add_(1)
    original["inner"]["state"][0]["exp_avg"].add_(1)
    state = copy.get()
    assert state["slow"][0].sum() == 0 and state["inner"]["state"][0]["exp_avg"].sum() == 0 and state["n"] == 3
    assert not copy.blocked  # nothing on a GPU: nothing the training thread waited for a GPU to copy


def test_a_pinned_arena_refuses_a_state_over_its_limit_before_pinning_anything():
    from workers.device import PinnedArena

    arena = PinnedArena(limit_bytes=256)
    assert arena.views([torch.zeros(100)]) is None  # 400 bytes
    assert arena.reserved_bytes == 0 and arena.pins == 0


def test_timeouts_grow_with_the_stage_and_never_fall_below_the_floors():
    worker = WorkerConfig(exchange_timeout_s=10.0, bootstrap_timeout_s=60.0, min_bandwidth_mbit_s=200.0)
    tiny = stage_timeouts(100_000, worker)
    assert (tiny.exchange_s, tiny.bootstrap_pull_s, tiny.bootstrap_s) == (10.0, 10.0, 60.0)
    # A 1b stage of 4 (about 300 M parameters): a 2.4 GB bootstrap at 200 Mbit/s is 96 s, x3.
    big = stage_timeouts(300_000_000, worker)
    assert big.bootstrap_pull_s == pytest.approx(transfer_s(2_400_000_000, 200.0)) == pytest.approx(288.0)
    assert big.exchange_s == pytest.approx(144.0) and big.bootstrap_s == pytest.approx(576.0)


@pytest.mark.parametrize("command", [["worker", "--stage", "0"], ["coordinator"]])
def test_a_store_that_cannot_be_opened_is_refused_before_anything_starts(capsys, monkeypatch, command):
    from tests.support.in_process import run_cli_in_process

    code, _, err = run_cli_in_process(capsys, monkeypatch, *command, "--redis-url", "redis://127.0.0.1:1",
                                      "--set", "store.url=nosuchproto://bucket/run")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "store.url 'nosuchproto://bucket/run' is not usable" in err and "Traceback" not in err
