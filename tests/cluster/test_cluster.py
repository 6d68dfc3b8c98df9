"""The distributed runtime with real processes: redis-server, workers, ZeroMQ on 127.0.0.1.

Each test starts its own small cluster (tiny model, 2 stages) and waits on the workers'
JSON log events with deadlines; every loop is bounded.
"""

from __future__ import annotations

import signal
import time
import urllib.request

import pytest

from noloco_rt.checkpoints.worker import load_checkpoint
from noloco_rt.membership.records import WorkerState
from workers.cluster.local_cluster import LocalCluster, tiny_val_loss
from workers.faults.data_path import data_faults_env

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def cluster(tmp_path):
    running = LocalCluster(tmp_path)
    yield running
    running.close()


@pytest.mark.slow
def test_two_by_two_trains_exchanges_and_routes_to_every_peer(tmp_path):
    # Stage-1 workers step when their microbatches are in, so their step counts drift; a wider
    # collection window lets the one behind (fed alone while its partner waits) catch up to
    # the seeded pair's step even while stage 0 is itself in a blocking exchange.
    cluster = LocalCluster(tmp_path, settings={"worker.exchange_timeout_s": 8.0})
    try:
        _two_by_two(cluster, tmp_path)
        assert cluster.error_events() == []  # fault-free
    finally:
        cluster.close()


def _two_by_two(cluster: LocalCluster, tmp_path) -> None:
    first = [cluster.start_worker(0, f"a{r}", steps=30) for r in range(2)]
    last = [cluster.start_worker(1, f"b{r}") for r in range(2)]
    port = cluster.wait_event(last[0], "metrics_serving", timeout_s=60)["port"]
    cluster.wait_event(last[0], "outer_step_done", timeout_s=120, where=lambda e: e["kind"] == "matched")
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'noloco_outer_steps_total{kind="matched"}' in metrics and "noloco_train_loss" in metrics
    for worker in first:
        cluster.wait_event(worker, "steps_done", timeout_s=180)
        assert worker.process.wait(20) == 0
    assert set(cluster.stop_all(last).values()) == {0}
    summaries = {w.name: w.events("worker_summary")[-1] for w in first + last}
    stage1_ids = {w.events("worker_started")[0]["worker"] for w in last}
    for name, summary in summaries.items():
        kinds = summary["outer_kinds"]
        assert kinds["matched"] + kinds["partial"] >= 1 and kinds["failed"] == 0, (name, summary)
    for worker in first:
        assert set(summaries[worker.name]["routed_to"]) == stage1_ids  # both stage-1 workers got work
    # Validation loss of the trained pipeline (stage 0 of a0, stage 1 of b0) against the untrained one.
    weights = [load_checkpoint(tmp_path / "checkpoints" / f"{name}.pt", run_id="default", stage=s)["fast"]
               for s, name in ((0, "a0"), (1, "b0"))]
    trained, untrained = tiny_val_loss(weights), tiny_val_loss(None)
    assert trained < untrained - 1.0, (trained, untrained)


def _start_two_by_two(cluster):
    workers = [cluster.start_worker(0, f"a{r}") for r in range(2)] + [cluster.start_worker(1, f"b{r}") for r in range(2)]
    cluster.wait_online(4)
    for worker in workers:
        cluster.wait_event(worker, "train_progress", timeout_s=60)
    return workers


@pytest.mark.slow
def test_sigterm_leaves_the_table_at_once_and_a_restart_resumes_while_a_joiner_bootstraps(cluster):
    """One cluster for both (its start is most of the cost): a SIGTERMed worker leaves at once
    and resumes its own checkpoint when started again; a new worker bootstraps from a peer."""
    workers = _start_two_by_two(cluster)
    victim = workers[3]
    victim_id = victim.events("worker_started")[0]["worker"]
    victim.process.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    cluster.wait_for(lambda: all(not m.worker_id.startswith(victim_id) for m in cluster.members(None)),
                     timeout_s=5, what="the victim to leave the table", interval_s=0.02)
    # The leave is immediate (the heartbeat thread's next 20 ms tick, or the training thread);
    # the bound leaves room for four workers on two cores (a clean-clone run measured 1.2 s).
    assert time.monotonic() - sent < 2.0
    assert victim.process.wait(15) == 0
    final = victim.events("checkpoint_written")[-1]
    assert final["reason"] == "leave"
    # The same worker started again resumes its own checkpoint instead of bootstrapping.
    again = cluster.start_worker(1, victim.name)
    resumed = cluster.wait_event(again, "resumed_checkpoint", timeout_s=60)
    assert resumed["inner_step"] == final["inner_step"]
    assert not again.events("bootstrapped")
    cluster.wait_event(again, "train_progress", timeout_s=90, where=lambda e: e["inner_step"] > final["inner_step"])
    before = {w.name: w.latest_inner_step() for w in workers[:3]}
    for worker in workers[:3]:
        cluster.wait_for(lambda w=worker: w.latest_inner_step() >= before[w.name] + 10, timeout_s=90,
                         what=f"{worker.name} to keep training")
        assert not [e for e in worker.events() if e.get("level") == "error"], worker.name

    # A joiner downloads its stage's state from a live peer, exactly what a donor served.
    for worker in (workers[2], again):
        cluster.wait_event(worker, "outer_step_done", timeout_s=90)
    # What the joiner reads: records still at outer step 0 (a heartbeat behind) would make it
    # take the seed, as it should while its stage is at step 0 (stage_at_seed).
    cluster.wait_for(lambda: all(m.outer_step >= 1 for m in cluster.members() if m.stage == 1), timeout_s=10,
                     what="stage 1's records to show its first outer step")
    joiner = cluster.start_worker(1, "b-late")
    booted = cluster.wait_event(joiner, "bootstrapped", timeout_s=60)
    served = [e for w in (workers[2], again) for e in w.events("bootstrap_served")]
    assert booted["checksum"] in {e["checksum"] for e in served}
    assert booted["outer_step"] >= 1
    cluster.wait_event(joiner, "member_online", timeout_s=10)
    cluster.wait_event(joiner, "train_progress", timeout_s=90)  # it received microbatches and stepped


@pytest.mark.slow
def test_killed_downstream_worker_microbatches_are_resent(cluster):
    workers = _start_two_by_two(cluster)
    victim = workers[3]
    # Killed in steady state, when stage 0 keeps forwards in flight there: killed right after its
    # first step (just joined, nothing routed to it yet) it may leave nothing to re-send.
    cluster.wait_event(victim, "train_progress", timeout_s=60, where=lambda e: e["inner_step"] >= 10)
    cluster.stop(victim, signal.SIGKILL)
    retried = cluster.wait_for(lambda: [e for w in workers[:2] for e in w.events("microbatch_retried")],
                               timeout_s=60, what="a re-sent microbatch")
    assert retried
    before = {w.name: w.latest_inner_step() for w in workers[:3]}
    for worker in workers[:3]:
        cluster.wait_for(lambda w=worker: w.latest_inner_step() >= before[w.name] + 10, timeout_s=90,
                         what=f"{worker.name} to keep training")


@pytest.mark.slow
def test_garbage_is_rejected_and_counted_and_a_redis_outage_does_not_stop_training(cluster):
    """One cluster for both (its start is most of the cost)."""
    import random

    import zmq

    from noloco_rt.net.transport import request

    workers = _start_two_by_two(cluster)
    target = workers[2]
    started = target.events("worker_started")[0]
    rng = random.Random(0)
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(started["data_addr"])
    try:
        for index in range(200):
            frames = [rng.randbytes(rng.randint(0, 64)) for _ in range(rng.randint(1, 4))]
            if index % 2:
                frames[0] = b"\x8a" + frames[0]  # looks like the start of a msgpack map
            push.send_multipart(frames)
        for _ in range(5):  # the exchange server answers garbage with an error message and lives on
            assert request(ctx, started["exchange_addr"], [rng.randbytes(40)], timeout_s=5) is not None
    finally:
        push.close()
        ctx.term()
    before = target.latest_inner_step()
    cluster.wait_for(lambda: target.latest_inner_step() >= before + 10, timeout_s=90, what="training after garbage")
    _redis_outage_training_goes_on_and_workers_reregister(cluster, workers)
    assert cluster.stop(target) == 0
    rejected = target.events("worker_summary")[-1]["rejected"]
    assert sum(rejected.values()) >= 205, rejected


def _redis_outage_training_goes_on_and_workers_reregister(cluster, workers):
    cluster.redis.stop()
    stopped = time.monotonic()
    during = {w.name: w.latest_inner_step() for w in workers}
    while time.monotonic() - stopped < 10:
        assert all(w.process.poll() is None for w in workers)
        time.sleep(0.2)
    advanced = {w.name: w.latest_inner_step() - during[w.name] for w in workers}
    cluster.redis.start()
    back = time.monotonic()
    cluster.wait_for(lambda: len(cluster.members({WorkerState.ONLINE})) == 4, timeout_s=5,
                     what="all four workers back in the table", interval_s=0.05)
    assert time.monotonic() - back < 5
    assert all(w.process.poll() is None for w in workers)
    assert all(steps > 0 for steps in advanced.values()), advanced  # training went on without Redis
    assert all(w.events("redis_unreachable") for w in workers)


@pytest.mark.slow
def test_downstream_workers_finish_with_their_upstream_whatever_their_own_count(cluster):
    """run.steps counts stage 0's inner steps (the data consumed). Routing shares stage 0's
    microbatches unequally between stage-1 workers, so a stage-1 worker may never reach
    run.steps by its own count; it must finish when every stage-0 worker has. Here the
    stage-1 workers are given a count they cannot reach: 2 x 20 steps x 2 microbatches
    are 40 forwards, at most 20 stage-1 steps each."""
    first = [cluster.start_worker(0, f"s0-{i}", steps=20) for i in range(2)]
    downstream = [cluster.start_worker(1, f"s1-{i}", steps=1000) for i in range(2)]
    for worker in [*first, *downstream]:
        assert cluster.wait_exit(worker, timeout_s=120) == 0, worker.log_text()[-2000:]
    for worker in downstream:
        done = cluster.wait_event(worker, "steps_done", timeout_s=1)
        assert 0 < done["inner_step"] <= 40, done


@pytest.mark.slow
def test_a_later_stage_steps_its_last_partial_step_and_takes_its_outer_step(cluster):
    """The end of the data need not fill a later stage's last inner step: stage 0 sends 10
    steps x 2 microbatches, stage 1 steps every 3, so its 7th step holds 2, the data of stage
    0's 10th step, which makes outer step 2 (h = 5) due. Both are taken at the end, as stage
    0 took its own, not left with their gradients unapplied."""
    first = cluster.start_worker(0, "s0", steps=10, **{"pipeline.max_inflight": 2, "outer.h": 5})
    last = cluster.start_worker(1, "s1", steps=1000, **{"pipeline.max_inflight": 3, "outer.h": 5})
    for worker in (first, last):
        assert cluster.wait_exit(worker, timeout_s=120) == 0, worker.log_text()[-2000:]
    upstream, summary = first.events("worker_summary")[-1], last.events("worker_summary")[-1]
    assert upstream["microbatches"] == summary["microbatches"] == 20, (upstream, summary)
    assert summary["inner_steps"] == 7, summary  # 6 of 3 microbatches, then the last 2
    assert summary["outer_steps"] == upstream["outer_steps"] == 2, (upstream, summary)


@pytest.mark.slow
def test_a_slow_next_stage_worker_receives_fewer_microbatches(cluster):
    """Routing rests on round trips this worker observes: a stage-1 worker whose gradient
    replies each come 500 ms late (an injected slow link, several times a tiny-model
    microbatch's compute) gets clearly fewer of stage 0's microbatches than its fast twin.
    The old queue-length p2c split them evenly: with two forwards in flight per step, each
    step sent one to each. outer.h exceeds the run, so no outer exchange couples the two
    stage-1 workers' pace."""
    settings = {"outer.h": 1000}
    fast = cluster.start_worker(1, "b-fast", **settings)
    slow = cluster.start_worker(1, "b-slow", env=data_faults_env(0.0, 500.0), **settings)
    cluster.wait_online(2, timeout_s=60)  # both reachable before stage 0 routes its first forward
    first = cluster.start_worker(0, "a0", steps=20, **settings)
    for worker in (first, fast, slow):
        assert cluster.wait_exit(worker, timeout_s=60) == 0, worker.log_text()[-2000:]
    routed = first.events("worker_summary")[-1]["routed_to"]
    fast_id, slow_id = (w.events("worker_started")[0]["worker"] for w in (fast, slow))
    assert routed.get(fast_id, 0) + routed.get(slow_id, 0) >= 40, routed  # 20 steps x 2 forwards
    assert routed.get(slow_id, 0) * 4 < routed.get(fast_id, 0), routed
    assert slow.events("worker_summary")[-1]["injected_delayed"] >= 1  # the fault was really there
