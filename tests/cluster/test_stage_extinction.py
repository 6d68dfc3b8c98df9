"""Durable run state with real processes (redis-server, workers, a folder store;
docs/architecture.md §4-§5): a stage whose replicas all die resumes from the store while the
other stage goes on, then every worker and Redis die (stage 0 first, and stage 1 must wait
for it rather than finish) and the run continues from the store.
Never re-seeded. One run for both, because a cluster's start is most of the cost."""

from __future__ import annotations

import signal
import time

import pytest

from noloco_rt.checkpoints.worker import load_checkpoint
from noloco_rt.membership.embedded_redis import EmbeddedRedis
from noloco_rt.store.backend import RunStore
from noloco_rt.store.cursors import DataCursors
from noloco_rt.store.run_mark import RunFinishedMark
from noloco_rt.store.stage_checkpoints import StageCheckpoints
from workers.cluster.local_cluster import LocalCluster, WorkerProcess, tiny_val_loss
from workers.finish import UPSTREAM_GONE_S

pytestmark = pytest.mark.timeout(360)

H = 5  # LocalCluster's outer.h
MORE_STEPS = 15
"""Inner steps the restarted stage 0 trains past the outer step it resumes at. The first
incarnations have no limit: they must still be training when they are killed, however fast
their clocks run (a pull can skip a slow one ahead)."""


def _kill_stage_1_and_replace(cluster: LocalCluster, checkpoints: StageCheckpoints, first: list[WorkerProcess],
                              doomed: list[WorkerProcess], fresh_dir: str) -> list[WorkerProcess]:
    for worker in doomed:
        cluster.stop(worker, signal.SIGKILL)
    reached = cluster.membership().high_water.of(1)
    infos = checkpoints.manifests(1)[0]  # newest first
    stored, stored_steps = infos[0], [info.outer_step for info in infos]
    # Redis shows operators a checkpoint that is in the store. The mark follows the store write,
    # so a kill between the two leaves it one checkpoint (store.every) behind the newest.
    durable = cluster.membership().high_water.durable_of(1)
    assert durable >= 4 and durable in stored_steps and stored.outer_step - durable <= 2, (durable, stored_steps)
    assert all(w.process.poll() is None for w in first), "stage 0 must not stop"

    fresh = [cluster.start_worker(1, f"c{r}", **{"paths.checkpoint_dir": fresh_dir}) for r in range(2)]
    # Whichever starts first resumes the store; the other resumes it too or bootstraps from it.
    resumed_by = cluster.wait_for(lambda: next((w for w in fresh if w.events("resumed_from_store")), None),
                                  timeout_s=90, what="a replacement to resume from the store")
    resumed = resumed_by.events("resumed_from_store")[0]
    # The newest complete checkpoint, checksum verified (a later one may have landed meanwhile).
    assert resumed["outer_step"] >= stored.outer_step and resumed["run_reached"] == reached
    infos = {i.sha256[:16]: i for i in checkpoints.manifests(1)[0]}
    assert resumed["sha256"] in infos and infos[resumed["sha256"]].outer_step == resumed["outer_step"]
    cluster.wait_online(4)
    for worker in fresh:
        assert not worker.events("first_of_stage"), worker.log_text()[-2000:]
    cluster.wait_event(resumed_by, "train_progress", timeout_s=90,  # counters continued, not restarted at 0
                       where=lambda e: e["inner_step"] > resumed["inner_step"])
    return fresh


def _kill_everything_and_restart(cluster: LocalCluster, workers: list[WorkerProcess], cursors: DataCursors,
                                 checkpoints: StageCheckpoints, fresh_dir: str) -> tuple[list[WorkerProcess], int]:
    first, later = [w for w in workers if w.stage == 0], [w for w in workers if w.stage == 1]
    for worker in first:  # stage 0 goes first, every replica at once
        cluster.stop(worker, signal.SIGKILL)
    # Stage 1 must wait for its upstream's replacements, not take its absence for a finish,
    # even past worker.upstream_lost_s (it says so: upstream_lost).
    until = time.monotonic() + UPSTREAM_GONE_S + 2
    while time.monotonic() < until:  # bounded; each pass can fail
        for worker in later:
            assert worker.process.poll() is None and not worker.events("steps_done"), worker.log_text()[-2000:]
        time.sleep(0.2)
    assert any(w.events("upstream_lost") for w in later), "the wait past upstream_lost_s was not reported"
    for worker in later:
        cluster.stop(worker, signal.SIGKILL)
    cluster.redis.stop()  # the membership table, high-water marks and all, is gone
    saved_cursor = cursors.load("a0")
    steps = checkpoints.newest_step(0) * H + MORE_STEPS  # stage 0 is dead: its newest checkpoint stays
    cluster.redis = EmbeddedRedis().start()
    # New pods: the same names (an Indexed Job's), empty local disks.
    again = [cluster.start_worker(w.stage, w.name, steps=steps if w.stage == 0 else 100_000,
                                  **{"paths.checkpoint_dir": fresh_dir}) for w in workers]
    # Each came back and turned ONLINE; not all four at once: stage 0 has MORE_STEPS left, which
    # it may finish with one stage-1 replica while the other is still starting on a loaded machine.
    for worker in again:
        cluster.wait_event(worker, "member_online", timeout_s=120)
    for stage in (0, 1):
        stage_workers = [w for w in again if w.stage == stage]
        assert any(w.events("resumed_from_store") for w in stage_workers), stage
        for worker in stage_workers:
            assert not worker.events("first_of_stage"), worker.log_text()[-2000:]
    restored = cluster.wait_event(again[0], "data_cursor_restored", timeout_s=10)
    assert (restored["epoch"], restored["position"]) == (saved_cursor.epoch, saved_cursor.position)
    return again, steps


@pytest.mark.slow
def test_a_stage_then_the_whole_run_and_redis_die_and_training_resumes_from_the_store(tmp_path):
    store = RunStore(str(tmp_path / "store"))
    # upstream_lost_s far below how long stage 0 stays dead: a stage gone that long must not end the run.
    cluster = LocalCluster(tmp_path, settings={"store.url": store.url, "store.every": 2,
                                               "worker.exchange_timeout_s": 4.0, "worker.upstream_lost_s": 2.0})
    checkpoints, cursors = StageCheckpoints(store, "default"), DataCursors(store, "default")
    try:
        first = [cluster.start_worker(0, f"a{r}", steps=100_000) for r in range(2)]
        doomed = [cluster.start_worker(1, f"b{r}") for r in range(2)]
        cluster.wait_for(lambda: (cluster.membership().high_water.durable_of(1) or 0) >= 4, timeout_s=150,
                         what="Redis's mark of a stage-1 checkpoint of outer step 4 in the store")
        fresh = _kill_stage_1_and_replace(cluster, checkpoints, first, doomed, str(tmp_path / "fresh"))

        cluster.wait_for(lambda: min(checkpoints.newest_step(s) for s in (0, 1)) >= 6 and cursors.load("a0"),
                         timeout_s=150, what="checkpoints of outer step 6 of both stages and a0's cursor")
        again, steps = _kill_everything_and_restart(cluster, first + fresh, cursors, checkpoints,
                                                    str(tmp_path / "again"))
        resumed = [e for w in again for e in w.events("resumed_from_store")]
        # Nothing went back to the seed: every stage resumed at outer step 6 or later, stage 0's
        # clock at 30 (6 of h = 5; its own inner steps may be fewer, when pulls skipped some);
        # a later stage's inner steps follow its share of the data.
        assert resumed and min(e["outer_step"] for e in resumed) >= 6, resumed
        assert min(e["clock_step"] for w in again[:2] for e in w.events("resumed_from_store")) >= 30, resumed

        for worker in again[:2]:
            done = cluster.wait_event(worker, "steps_done", timeout_s=240)
            assert done["inner_step"] <= steps, (done, steps)
            assert worker.process.wait(20) == 0
        for worker in again[2:]:  # stage 1 finishes with its upstream, and marks the run finished
            cluster.wait_event(worker, "steps_done", timeout_s=60)
            assert worker.process.wait(20) == 0
        assert RunFinishedMark(store, "default").steps() is not None
        written = [w.events("worker_summary")[-1]["store"] for w in again]
        assert sum(c["written"] for c in written) >= 1 and all(c["failed"] == 0 for c in written), written
    finally:
        cluster.close()
    weights = [load_checkpoint(tmp_path / "again" / f"{name}.pt", run_id="default", stage=s)["fast"]
               for s, name in ((0, "a0"), (1, "c0"))]
    trained, untrained = tiny_val_loss(weights), tiny_val_loss(None)
    assert trained < untrained - 1.0, (trained, untrained)
