"""A network partition, in network namespaces made here: each worker has its own, Redis sits in
the hub that routes between them (workers/faults/netns.py). Two workers of a stage cannot reach
each other, and a third cannot reach Redis, while all keep running; then the network heals.

Asserted: every side keeps training through the split, nothing is lost (each stage-0 worker's
microbatches are all trained or counted dropped, every worker leaves cleanly), the replicas'
mean is kept (Σ c = 0 over every round both sides applied alike), and the split pair pairs
again after the heal.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from noloco_rt.logs import record_seconds
from noloco_rt.membership.embedded_redis import EmbeddedRedis
from workers.cluster.chaos_faults import Partitions
from workers.cluster.chaos_report import mean_kept, microbatch_accounting
from workers.cluster.local_cluster import LocalCluster, WorkerProcess
from workers.faults import netns

pytestmark = pytest.mark.slow  # real processes: left out of the fast loop (pytest -m "not slow")

# rank: (stage, name). Stage 0 has three replicas (a and b will be split, c cut from Redis).
WORKERS = {0: (0, "s0a"), 1: (0, "s0b"), 2: (0, "s0c"), 3: (1, "s1a"), 4: (1, "s1b")}
REDIS_PORT = 6379


def _namespaces_or_skip() -> None:
    why_not = Partitions.unavailable()  # the chaos driver's own check
    if why_not is not None:
        pytest.skip(reason=f"{why_not}: network namespaces need root and iproute2")


@pytest.fixture
def partitioned_cluster(tmp_path):
    _namespaces_or_skip()
    netns.create(len(WORKERS))
    redis = None
    cluster = None
    try:
        redis = EmbeddedRedis(host=netns.SERVICE_IP, port=REDIS_PORT, prefix=netns.hub_prefix()).start()
        cluster = LocalCluster(tmp_path, stages=2, redis=redis, workers_redis_url=redis.tcp_url,
                               # the cut pair's backoff grows while split: kept short so they pair soon after the heal
                               settings={"worker.heartbeat_interval_s": 0.5, "outer.h": 5,
                                         "worker.peer_backoff_max_s": 4.0})
        yield cluster
    finally:
        if cluster is not None:
            cluster.close()
        elif redis is not None:
            redis.stop()
        netns.cleanup()


def _after(worker: WorkerProcess, event: str, since: float, where: Callable[[dict[str, Any]], bool] = lambda e: True
           ) -> list[dict[str, Any]]:
    """`event` lines of `worker` logged after wall time `since`."""
    return [e for e in worker.events(event) if record_seconds(e["timestamp"]) > since and where(e)]


def test_a_split_stage_and_a_worker_cut_from_redis_keep_training_and_pair_again_after_the_heal(
        partitioned_cluster: LocalCluster):
    cluster = partitioned_cluster
    workers = {rank: cluster.start_worker(stage, name, prefix=netns.exec_prefix(rank),
                                          **{"network.bind_host": netns.worker_ip(rank),
                                             "network.trusted_network": "true",  # namespaces of our own
                                             "network.advertise_host": netns.worker_ip(rank)})
               for rank, (stage, name) in WORKERS.items()}
    a, b, c = workers[0], workers[1], workers[2]
    # Training and pairing before the split: every stage-0 worker has taken an outer step.
    cluster.wait_for(lambda: all(w.events("outer_step_done") for w in (a, b, c)), timeout_s=180,
                     what="a first outer step of every stage-0 worker")
    ids = {w.events("worker_started")[0]["worker"][:8]: w.name for w in workers.values()}

    split_at = time.time()
    netns.cut(netns.worker_ip(0), netns.worker_ip(1))
    netns.cut(netns.worker_ip(2), netns.SERVICE_IP)
    # c, off Redis, says so and leaves the table (its record expires: nobody else can see it).
    cluster.wait_for(lambda: _after(c, "redis_unreachable", split_at), timeout_s=60, what="s0c to miss Redis")
    cluster.wait_for(lambda: "s0c" not in {m.name for m in cluster.members()}, timeout_s=60,
                     what="s0c's record to expire")
    gone_at = time.time()
    # Both sides train on: each of the three takes two more outer steps (ten inner steps) while
    # split, c on its cached view of the table.
    cluster.wait_for(lambda: all(len(_after(w, "outer_step_done", gone_at)) >= 2 for w in (a, b, c)),
                     timeout_s=240, what="two outer steps of each stage-0 worker during the split")
    # Rounds logged once a round begun before the cut has run out of time (the exchange timeout).
    settled = split_at + cluster.settings["worker.exchange_timeout_s"]
    during = {w.name: [ids.get(u, u) for e in _after(w, "outer_step_done", settled) for u in e["used"]]
              for w in (a, b, c)}
    assert all(w.process.poll() is None for w in workers.values())
    healed_at = time.time()
    netns.heal(netns.worker_ip(0), netns.worker_ip(1))
    netns.heal(netns.worker_ip(2), netns.SERVICE_IP)
    assert netns.cuts() == []

    # After the heal a and b pair with each other again, and c is back in the table and pairs.
    def paired_again() -> bool:
        used = {w.name: {ids.get(u, u) for e in _after(w, "outer_step_done", healed_at) for u in e["used"]}
                for w in (a, b, c)}
        return "s0b" in used["s0a"] and "s0a" in used["s0b"] and bool(used["s0c"])

    cluster.wait_for(paired_again, timeout_s=240, what="s0a and s0b pairing again, and s0c pairing, after the heal")
    assert _after(c, "member_reregistered", healed_at) or _after(c, "redis_recovered", healed_at)
    codes = cluster.stop_all(list(workers.values()), signal.SIGTERM, timeout_s=60)
    assert set(codes.values()) == {0}, (codes, *(w.log_text()[-2000:] for w in workers.values()
                                                 if codes[w.name] != 0))

    print(f"partners' states used during the split: {during}")
    # The split pair never used each other's state in a round begun while split.
    assert "s0b" not in during["s0a"] and "s0a" not in during["s0b"], during
    logs = {(w.name, 0): w.events() for w in workers.values()}
    accounting = microbatch_accounting(logs, ["s0a", "s0b", "s0c"])
    assert accounting.graceful == 3 and not accounting.mismatches and accounting.sent > 0, accounting
    # Σ c = 0 in every round both sides of each pair applied alike; a round cut between a push
    # and its acknowledgement is one-sided (counted, not hidden: workers/cluster/chaos_report.py).
    kept = mean_kept(logs)
    print(f"rounds checked {kept['checked']}, one-sided {kept['one_sided']}")
    assert kept["checked"] > 0 and kept["broken"] == [], kept
