"""Matched outer-step groups in real worker processes (DESIGN §4): 1 stage × 4 workers, each
training alone and pushing its snapshot to the partner its view's partition gives it, with
the blocking step and with the overlapped one (provisional step, correction later)."""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest

from tests.cluster import LocalCluster


@pytest.mark.parametrize(("overlap", "pairing"), [(False, "matched"), (True, "matched"), (True, "ready")],
                         ids=["blocking", "overlap", "overlap-ready"])
def test_partners_choose_each_other_and_fault_free_steps_keep_the_mean(tmp_path, overlap, pairing):
    cluster = LocalCluster(tmp_path, stages=1, settings={"outer.h": 5, "outer.overlap": overlap,
                                                         "outer.max_delay_steps": 3, "outer.pairing": pairing})
    try:
        workers = [cluster.start_worker(0, f"w{i}", steps=60) for i in range(4)]
        for worker in workers:
            assert cluster.wait_exit(worker, timeout_s=240) == 0
        ids = {w.events("worker_started")[0]["worker"]: w.name for w in workers}
        steps = {(ids[e["worker"]], e["outer_step"]): e for w in workers for e in w.events("outer_step_done")}
    finally:
        cluster.close()
    assert len(steps) == 4 * 12  # 60 inner steps, h = 5
    kinds = Counter(e["kind"] for e in steps.values())
    reciprocal = checked = 0  # a partner that computed a group names us back
    for (name, k), event in steps.items():
        for partner in event["group"]:
            theirs = steps.get((ids[next(i for i in ids if i.startswith(partner))], k))
            checked += 1
            reciprocal += any(name == ids[i] for p in theirs["group"] for i in ids if i.startswith(p))
    delays = Counter(e["delay"] for e in steps.values() if e["kind"] == "matched")
    print(f"outer steps by kind: {dict(kinds)}; reciprocal partners {reciprocal}/{checked}; delays {dict(delays)}")
    assert kinds["matched"] >= 0.75 * len(steps), kinds  # the first steps may precede everyone's ONLINE
    assert checked and reciprocal >= 0.9 * checked, (reciprocal, checked)
    # Pairs, or one group of three while a view holds an odd count (a worker not ONLINE yet).
    assert all(1 <= len(e["group"]) <= 2 for e in steps.values() if e["kind"] == "matched")
    assert all(e["delay"] == 0 for e in steps.values()) if not overlap else max(delays) >= 1
    _assert_mean_kept(steps)


def _assert_mean_kept(steps: dict) -> None:
    """At a step where all four were matched, the corrections (what the group step adds beyond
    each local step) sum to zero: the replicas' mean of φ moves by the mean local update only."""
    by_step: dict[int, list[dict]] = defaultdict(list)
    for (_, k), event in steps.items():
        by_step[k].append(event)
    whole = [k for k, events in by_step.items() if len(events) == 4 and all(e["kind"] == "matched" for e in events)]
    assert len(whole) >= 6, sorted(by_step)
    for k in whole:
        total = sum(e["correction_sum"] for e in by_step[k])
        size = sum(e["correction_abs"] for e in by_step[k])
        assert size > 0 and abs(total) <= 1e-4 * size, (k, total, size)
