"""A stage whose replicas all die is resumed from the durable store, never re-seeded
(docs/architecture.md §5): real redis-server, real worker processes, a folder store."""

from __future__ import annotations

import signal

import pytest

from noloco_rt.checkpoint import load_checkpoint
from noloco_rt.membership.embedded_redis import EmbeddedRedis
from noloco_rt.store.backend import RunStore
from noloco_rt.store.cursors import DataCursors
from noloco_rt.store.stage_checkpoints import StageCheckpoints
from tests.cluster import LocalCluster
from tests.test_cluster import _val_loss

pytestmark = pytest.mark.timeout(300)

STEPS = 60


def test_a_stage_whose_replicas_all_die_resumes_from_the_store_while_stage_0_goes_on(tmp_path):
    store = tmp_path / "store"
    cluster = LocalCluster(tmp_path, settings={"store.url": str(store), "store.every": 2,
                                               "worker.exchange_timeout_s": 4.0})
    checkpoints = StageCheckpoints(RunStore(str(store)), "default")
    try:
        first = [cluster.start_worker(0, f"a{r}", steps=STEPS) for r in range(2)]
        doomed = [cluster.start_worker(1, f"b{r}") for r in range(2)]
        cluster.wait_for(lambda: checkpoints.newest_step(1) >= 4, timeout_s=150,
                         what="a stage-1 checkpoint of outer step 4 in the store")
        for worker in doomed:
            cluster.stop(worker, signal.SIGKILL)
        reached = cluster.membership().high_water.of(1)
        stored = checkpoints.manifests(1)[0][0]
        assert cluster.membership().high_water.durable_of(1) == stored.outer_step  # Redis shows it to operators
        assert all(w.process.poll() is None for w in first), "stage 0 must not stop"

        fresh = [cluster.start_worker(1, f"c{r}", **{"paths.checkpoint_dir": str(tmp_path / "fresh")})
                 for r in range(2)]
        # Whichever starts first resumes the store; the other resumes it too or bootstraps from it.
        resumed_by = cluster.wait_for(lambda: next((w for w in fresh if w.events("resumed_from_store")), None),
                                      timeout_s=90, what="a replacement to resume from the store")
        resumed = resumed_by.events("resumed_from_store")[0]
        # The newest complete checkpoint, checksum verified (a later one may have landed meanwhile).
        assert resumed["outer_step"] >= stored.outer_step and resumed["run_reached"] == reached
        infos = {i.sha256[:16]: i for i in checkpoints.manifests(1)[0]}
        assert resumed["sha256"] in infos and infos[resumed["sha256"]].outer_step == resumed["outer_step"]
        # The second replacement bootstraps from the first, or resumes the store too: never the seed.
        cluster.wait_online(4)
        for worker in fresh:
            assert not worker.events("first_of_stage"), worker.log_text()[-2000:]

        for worker in first:
            cluster.wait_event(worker, "steps_done", timeout_s=240)
            assert worker.process.wait(20) == 0
        for worker in fresh:
            assert cluster.stop(worker) == 0
        after = resumed_by.events("train_progress")
        assert after[0]["inner_step"] >= resumed["inner_step"]  # counters continued, not restarted at 0
    finally:
        cluster.close()
    final = ((0, tmp_path / "checkpoints" / "a0.pt"), (1, tmp_path / "fresh" / f"{resumed_by.name}.pt"))
    weights = [load_checkpoint(path, run_id="default", stage=s)["fast"] for s, path in final]
    trained, untrained = _val_loss(weights), _val_loss(None)
    assert trained < untrained - 1.0, (trained, untrained)


def test_every_worker_and_redis_killed_the_run_continues_from_the_store(tmp_path):
    store = tmp_path / "store"
    cluster = LocalCluster(tmp_path, settings={"store.url": str(store), "store.every": 2,
                                               "worker.exchange_timeout_s": 4.0})
    checkpoints = StageCheckpoints(RunStore(str(store)), "default")
    cursors = DataCursors(RunStore(str(store)), "default")
    try:
        before = [cluster.start_worker(0, f"a{r}", steps=STEPS) for r in range(2)]
        before += [cluster.start_worker(1, f"b{r}") for r in range(2)]
        cluster.wait_for(lambda: min(checkpoints.newest_step(s) for s in (0, 1)) >= 4 and cursors.load("a0"),
                         timeout_s=150, what="checkpoints of both stages and a0's cursor in the store")
        for worker in before:
            cluster.stop(worker, signal.SIGKILL)
        cluster.redis.stop()  # the membership table, high-water marks and all, is gone
        saved_cursor = cursors.load("a0")
        cluster.redis = EmbeddedRedis().start()

        # New pods: same names (an Indexed Job's), empty local disks.
        after = [cluster.start_worker(w.stage, w.name, steps=STEPS if w.stage == 0 else 100_000,
                                      **{"paths.checkpoint_dir": str(tmp_path / "fresh")}) for w in before]
        cluster.wait_online(4, timeout_s=120)
        for stage in (0, 1):
            stage_workers = [w for w in after if w.stage == stage]
            assert any(w.events("resumed_from_store") for w in stage_workers), stage
            for worker in stage_workers:
                assert not worker.events("first_of_stage"), worker.log_text()[-2000:]
        restored = cluster.wait_event(after[0], "data_cursor_restored", timeout_s=10)
        assert (restored["epoch"], restored["position"]) >= (saved_cursor.epoch, saved_cursor.position)
        resumed_step = min(e["inner_step"] for w in after for e in w.events("resumed_from_store"))
        assert resumed_step >= 20  # 4 outer steps of h = 5

        for worker in after[:2]:
            cluster.wait_event(worker, "steps_done", timeout_s=240)
            assert worker.process.wait(20) == 0
        for worker in after[2:]:
            assert cluster.stop(worker) == 0
    finally:
        cluster.close()
    weights = [load_checkpoint(tmp_path / "fresh" / f"{name}.pt", run_id="default", stage=s)["fast"]
               for s, name in ((0, "a0"), (1, "b0"))]
    trained, untrained = _val_loss(weights), _val_loss(None)
    assert trained < untrained - 1.0, (trained, untrained)
