"""No host synchronisation inside an inner step (docs/architecture.md §9): real workers with
worker.count_host_reads log the training thread's reads of tensor values per progress line,
the line's own reads excluded, and there must be none, in every data-path role and across
outer steps (local and matched). On a CPU the same reads that would stall a GPU are counted
(noloco_rt/host_reads.py)."""

from __future__ import annotations

import pytest

from workers.cluster.local_cluster import LocalCluster, WorkerProcess

pytestmark = pytest.mark.slow  # real processes: left out of the fast loop (pytest -m "not slow")

STEPS = 20
COUNTED = {"worker.count_host_reads": True, "outer.h": 5, "worker.upstream_gone_s": 1.0}


def _host_reads_by_line(worker: WorkerProcess) -> list[tuple[int, int]]:
    """(inner step, host reads since the previous progress line) of each progress line."""
    return [(e["inner_step"], e["host_reads"]) for e in worker.events("train_progress")]


def _assert_no_reads(workers: list[WorkerProcess]) -> None:
    for worker in workers:
        lines = _host_reads_by_line(worker)
        assert [step for step, _ in lines] == [1, 10, 20], (worker.name, lines)  # every window was logged
        assert all(reads == 0 for _, reads in lines), (worker.name, lines)


def test_first_middle_and_last_stage_read_nothing_back_between_progress_lines(tmp_path):
    cluster = LocalCluster(tmp_path, stages=3, settings=COUNTED)
    try:
        workers = [cluster.start_worker(stage, f"s{stage}", steps=STEPS) for stage in range(3)]
        for worker in workers:
            assert cluster.wait_exit(worker, timeout_s=180) == 0
        assert cluster.error_events() == []
    finally:
        cluster.close()
    _assert_no_reads(workers)
    losses = [e.get("loss") for e in workers[2].events("train_progress")]
    assert all(isinstance(loss, float) for loss in losses), losses  # read at the progress cadence
    assert losses[-1] < losses[0]


def test_a_one_stage_worker_reads_nothing_back_between_progress_lines(tmp_path):
    cluster = LocalCluster(tmp_path, stages=1, settings=COUNTED)
    try:
        worker = cluster.start_worker(0, "alone", steps=STEPS)
        assert cluster.wait_exit(worker, timeout_s=180) == 0
        assert cluster.error_events() == []
    finally:
        cluster.close()
    assert len(worker.events("outer_step_done")) == STEPS // 5  # outer steps ran inside the counted windows
    _assert_no_reads([worker])
