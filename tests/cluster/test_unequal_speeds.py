"""Workers of unequal speed (docs/architecture.md §4, "Drift"), real processes: 1 stage × 4, one worker
slowed 2× (worker.fault_slowdown), the overlapped step with the seeded matching. The slow
worker's own step count falls behind; its partners' pushes pull it to each outer step,
so pairs still form, and they stay symmetric."""

from __future__ import annotations

import signal
from collections import Counter

import pytest

from workers.cluster.local_cluster import LocalCluster, each_outer_step_once, one_sided_share

pytestmark = pytest.mark.timeout(300)


def test_one_sided_share_counts_unreturned_uses():
    assert one_sided_share({"a": ["b", "b"], "b": ["a", "a"]}) == 0.0
    assert one_sided_share({"a": ["b"], "b": []}) == 1.0
    assert one_sided_share({"a": ["b", "c"], "b": ["a"], "c": []}) == pytest.approx(1 / 3)


@pytest.mark.slow
def test_a_worker_slowed_twice_still_pairs_symmetrically(tmp_path):
    # Lossless, so that every pair's corrections cancel exactly (the check at the end). The
    # default outer step otherwise (overlapped, rounds open until the next outer step): with
    # h = 10 a partner may wait for the slow worker's pull up to 9 of its own inner steps,
    # which a worker "2x" slower on a loaded 2-core machine (5-8x measured) needs.
    cluster = LocalCluster(tmp_path, stages=1, settings={"outer.h": 10, "worker.snapshot_codec": "shuffle-zstd"})
    try:
        fast = [cluster.start_worker(0, f"fast{i}", steps=100) for i in range(3)]
        slow = cluster.start_worker(0, "slow", steps=50, **{"worker.fault_slowdown": 2.0})
        victim = cluster.start_worker(0, "victim", steps=100)
        # Killed as soon as it has used a partner's state: its round is between the exchange
        # and the correction, the partner's maybe already applied.
        cluster.wait_for(lambda: victim.events("peer_exchange_done"), timeout_s=120, what="the victim to pair once",
                         interval_s=0.02)
        assert cluster.stop(victim, signal.SIGKILL) == -signal.SIGKILL
        for worker in (*fast, slow):
            assert cluster.wait_exit(worker, timeout_s=240) == 0
        assert cluster.error_events() == []  # slow, not faulty
    finally:
        cluster.close()
    survivors = (*fast, slow)
    ids = {w.events("worker_started")[0]["worker"][:8]: w.name for w in (*survivors, victim)}
    events = {w.name: w.events("outer_step_done") for w in survivors}
    kinds = Counter(e["kind"] for evs in events.values() for e in evs)
    used = {name: [ids[u] for e in evs for u in e["used"]] for name, evs in events.items()}
    victim_events = victim.events("outer_step_done")
    victim_used = Counter(ids[u] for e in victim_events for u in e["used"])
    # A survivor's uses of the victim beyond the victim's uses of it, latest first: the rounds
    # the victim died in before applying its side (their Σ c has no other half).
    unreturned = [e for name, evs in events.items()
                  for e in [e for e in evs if "victim" in {ids[u] for u in e["used"]}][victim_used[name]:]]
    between_survivors = {name: [u for u in uses if u != "victim"] for name, uses in used.items()}
    share = one_sided_share(between_survivors)
    slow_summary = slow.events("worker_summary")[-1]
    total = sum(kinds.values())
    print(f"outer steps by kind: {dict(kinds)}; one-sided share between survivors {share:.3f}; slow paired with "
          f"{Counter(used['slow'])}; uses of the victim it never returned {len(unreturned)}; slow worker's inner "
          f"steps {slow_summary['inner_steps']}, pulled {slow_summary['pulled_outer_steps']} times, skipping "
          f"{slow_summary['skipped_steps']}")
    # Every outer step from each worker's start to its last (10 of h = 10 in 100 steps, 5 for
    # the slow one's 50 on its clock), but those a pull jumped over: one that came online after a
    # peer's first outer step (a slow start on a loaded machine) bootstrapped from it at that
    # step and counts from there.
    started_at = {w.name: (w.events("bootstrapped") or [{"outer_step": 0}])[0]["outer_step"] for w in survivors}
    last_outer_step = {**{w.name: 10 for w in fast}, slow.name: 5}
    for worker in survivors:
        steps = [e["outer_step"] for e in events[worker.name]]
        assert each_outer_step_once(steps, first=started_at[worker.name] + 1, last=last_outer_step[worker.name],
                                    jumped_over=worker.outer_steps_jumped_over()), (worker.name, steps)
    # The slow worker kept the stage's outer clock by being pulled, not by its own count: it
    # took its 5 outer steps in fewer than 50 inner steps of its own.
    assert slow_summary["pulled_outer_steps"] >= 1 and slow_summary["skipped_steps"] >= 1, slow_summary
    assert slow_summary["inner_steps"] + slow_summary["skipped_steps"] == 50, slow_summary
    # Before the pull, the seeded matching measured 57 % here (the slow worker never paired:
    # it fell further behind every step) and pairing by readiness 81-90 % (h = 5; asserted
    # 75 %). With the pull, 86-100 % in eight runs: what is left is the membership changes the
    # test makes (the victim's death, the slow worker leaving at its 50 steps), across which
    # views briefly disagree.
    # Five workers make one group of three every step until the victim dies (three again once
    # the slow one leaves); a partner of three whose push came after the round closed leaves it
    # partial: a group that formed, used symmetrically (below). CI once saw 26 matched and 5
    # partial of 34 (0.76 matched alone, 0.91 together).
    assert kinds["matched"] + kinds["partial"] >= 0.8 * total and kinds["matched"] >= 0.6 * total, kinds
    assert used["slow"], "the slow worker never paired"
    # Symmetric: a late round is closed on both sides or applied on both (workers/outer/step.py),
    # so between workers that lived, every use of a partner's state is returned, and over every
    # applied correction Σ c = 0 (the replicas' mean is kept), the victim's own included. Only
    # the victim's partners in the round it died in may hold a use it never returned: one, or
    # two where an odd count of workers made that round's group three.
    assert share == 0.0, between_survivors
    assert len(unreturned) <= 2 and len({e["outer_step"] for e in unreturned}) <= 1, unreturned
    # Its group in that round is excluded whole: with three, the other survivor may have used
    # only the first (a partial round), whose own use of the victim has no other half.
    died_in = {e["outer_step"] for e in unreturned}
    entangled = [e for evs in events.values() for e in evs
                 if e["outer_step"] in died_in and "victim" in {ids.get(g) for g in e["group"]}]
    applied = [e for evs in (*events.values(), victim_events) for e in evs
               if "correction_sum" in e and e not in entangled]
    assert applied and abs(sum(e["correction_sum"] for e in applied)) <= 1e-4 * sum(
        e["correction_abs"] for e in applied)
