"""The outer exchange under faults, real processes (docs/architecture.md §4): a partner SIGKILLed
mid-run leaves its partners' steps local (counted, training never waits for it), and a
joiner mid-run is never used by a worker whose computed group does not hold it."""

from __future__ import annotations

import signal

import pytest

from workers.cluster.local_cluster import LocalCluster, each_outer_step_once

pytestmark = pytest.mark.timeout(300)


@pytest.mark.slow
def test_a_killed_partner_leaves_local_steps_and_a_joiner_enters_groups_only(tmp_path):
    # Heartbeats of 3 s: the dead victim stays listed (3 heartbeats) long enough for the
    # survivor's next outer steps to draw it, even on a loaded machine. With the default
    # 0.25 s of LocalCluster it vanished from the view before a slow survivor's next step.
    cluster = LocalCluster(tmp_path, stages=1, settings={"outer.h": 5, "outer.overlap": "true",
                                                         "outer.max_delay_steps": 4,
                                                         "worker.exchange_timeout_s": 2.0,
                                                         "worker.heartbeat_interval_s": 3.0})
    try:
        survivor = cluster.start_worker(0, "survivor")  # trains until stopped: until it met the joiner
        cluster.wait_online(1)  # the survivor is first of its stage: its outer steps count from 1
        victim = cluster.start_worker(0, "victim")
        cluster.wait_for(lambda: len(victim.events("outer_step_done")) >= 3, timeout_s=120,
                         what="the pair to take a few outer steps")
        # Rounds begun after the kill: the survivor's last settled step, one in flight, and
        # one more it may begin before the signal lands are left out.
        settled_before = max((e["outer_step"] for e in survivor.events("outer_step_done")), default=0)
        assert cluster.stop(victim, signal.SIGKILL) == -signal.SIGKILL
        killed_at = survivor.latest_inner_step()
        cluster.wait_for(lambda: survivor.latest_inner_step() >= killed_at + 25, timeout_s=120,
                         what="the survivor to train on alone")
        joiner = cluster.start_worker(0, "joiner")  # counts on from the donor's step
        joiner_id = cluster.wait_event(joiner, "worker_started", timeout_s=60)["worker"][:8]
        cluster.wait_for(lambda: any(joiner_id in e["used"] for e in survivor.events("outer_step_done")),
                         timeout_s=120, what="the survivor to pair with the joiner")
        assert cluster.stop(survivor) == 0  # a graceful leave
        cluster.stop(joiner)
    finally:
        cluster.close()
    victim_id = victim.events("worker_started")[0]["worker"][:8]
    events = survivor.events("outer_step_done")
    after_kill = [e for e in events if e["outer_step"] >= settled_before + 3 and victim_id in e["group"]]
    kinds = {e["kind"] for e in after_kill}
    print(f"survivor's steps with the dead partner in its group: {[(e['kind'], e['delay']) for e in after_kill]}")
    assert after_kill and kinds <= {"local", "dropped_late"}, after_kill
    # Training went on while each of those waited for the dead partner: a local step, not a stall.
    # Every outer step is logged once, from 1 to the last (but any a pull jumped over).
    steps = [e["outer_step"] for e in events]
    assert not survivor.events("bootstrapped") and each_outer_step_once(
        steps, first=1, last=max(steps), jumped_over=survivor.outer_steps_jumped_over()), steps
    for worker in (survivor, joiner):
        for event in worker.events("outer_step_done"):
            assert set(event["used"]) <= set(event["group"]), event
    assert survivor.events("worker_summary"), "the survivor's leave was not graceful"
