"""A full disk under a real worker (redis-server and a `noloco-rt worker` process): its
checkpoint writes fail with ENOSPC after the first (workers/faults/checkpoint_writes.py),
it trains to the end and exits 0 reporting the failures, and a restart resumes from the
last checkpoint that was written."""

from __future__ import annotations

import pytest

from workers.cluster.local_cluster import LocalCluster
from workers.faults.checkpoint_writes import disk_full_env

pytestmark = pytest.mark.timeout(180)

STEPS, H = 15, 5


@pytest.mark.slow
def test_a_worker_whose_disk_fills_trains_on_and_a_restart_resumes_its_last_good_checkpoint(tmp_path):
    cluster = LocalCluster(tmp_path, stages=1, settings={"outer.method": "local", "outer.h": H,
                                                         "worker.checkpoint_every": 1})
    try:
        worker = cluster.start_worker(0, "solo", steps=STEPS, env=disk_full_env(1))
        assert cluster.wait_exit(worker, timeout_s=120) == 0, worker.log_text()[-3000:]
        [written] = worker.events("checkpoint_written")  # the one write before the disk filled
        assert (written["outer_step"], written["inner_step"]) == (1, H)
        failed = worker.events("checkpoint_failed")
        assert failed and {f["kind"] for f in failed} == {"ENOSPC"} and failed[-1]["reason"] == "finished"
        assert worker.events("steps_done")[-1]["inner_step"] == STEPS  # trained to the end
        summary = worker.events("worker_summary")[-1]
        counts = summary["checkpoint"]
        assert counts["written"] == 1 and counts["failed"] == {"ENOSPC": len(failed)}
        # One attempt per outer step after the first (failed, or skipped while one was in
        # flight), and the final one.
        assert len(failed) + counts["skipped_busy"] == summary["outer_steps"]
        assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["solo.pt"]  # no temporary left

        again = cluster.start_worker(0, "solo", steps=STEPS + 2 * H)  # the disk has room again
        assert cluster.wait_exit(again, timeout_s=120) == 0, again.log_text()[-3000:]
        [resumed] = again.events("resumed_checkpoint")
        assert (resumed["outer_step"], resumed["inner_step"]) == (1, H)
        assert again.events("worker_summary")[-1]["checkpoint"]["failed"] == {}
        assert cluster.error_events() == []
    finally:
        cluster.close()
