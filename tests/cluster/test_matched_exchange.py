"""Matched outer-step groups in real worker processes (docs/architecture.md §4): 1 stage × 4 workers, each
training alone and pushing its snapshot to the partner its view's partition gives it, with
the blocking step and with the overlapped one (provisional step, correction later)."""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest

from noloco_rt.checkpoints.worker import load_checkpoint
from workers.cluster.local_cluster import LocalCluster, each_outer_step_once, one_sided_share

pytestmark = pytest.mark.slow  # real processes: left out of the fast loop (pytest -m "not slow")


# Overlap with seeded groups runs in tests/cluster/test_exchange_faults.py, with readiness pairing in
# tests/cluster/test_unequal_speeds.py (one-sided uses, Σ c = 0 over partners at different steps).
# The default codec: its rounding cancels in a pair, each side averaging with its own state
# as the other decoded it. Small chunks: every snapshot streams in about 20.
@pytest.mark.parametrize(("overlap", "pairing"), [(False, "matched")], ids=["blocking"])
def test_partners_choose_each_other_and_fault_free_steps_keep_the_mean(tmp_path, overlap, pairing):
    cluster = LocalCluster(tmp_path, stages=1, settings={"outer.h": 5, "outer.overlap": overlap,
                                                         "outer.max_delay_steps": 3, "outer.pairing": pairing,
                                                         "worker.snapshot_chunk_mb": 0.05})
    try:
        workers = [cluster.start_worker(0, f"w{i}", steps=60) for i in range(4)]
        for worker in workers:
            assert cluster.wait_exit(worker, timeout_s=240) == 0
        ids = {w.events("worker_started")[0]["worker"]: w.name for w in workers}
        jumped = {w.name: w.outer_steps_jumped_over() for w in workers}
        started_at = {w.name: (w.events("bootstrapped") or [{"outer_step": 0}])[0]["outer_step"] for w in workers}
        # Steps a pull jumped over: never taken, so a partner that drew us for one has no answer.
        never_taken = {(w.name, k) for w in workers for e in w.events("outer_step_pulled")
                       for k in range(e["outer_step"] - e["skipped_outer_steps"], e["outer_step"])}
        steps = {(ids[e["worker"]], e["outer_step"]): e for w in workers for e in w.events("outer_step_done")}
        assert cluster.error_events() == []  # fault-free
    finally:
        cluster.close()
    # 60 inner steps, h = 5: each worker logs every outer step up to 12 from its first (one that
    # bootstrapped from an early peer starts at that peer's step: on a loaded machine the last
    # to start may find the first a few steps ahead), but those a pull jumped over.
    for name in ids.values():
        mine = sorted(k for (who, k) in steps if who == name)
        assert each_outer_step_once(mine, first=started_at[name] + 1, last=12, jumped_over=jumped[name]), (
            name, mine, jumped, started_at)
    kinds = Counter(e["kind"] for e in steps.values())
    delays = Counter(e["delay"] for e in steps.values() if e["kind"] == "matched")
    print(f"outer steps by kind: {dict(kinds)}; delays {dict(delays)}")
    assert kinds["matched"] >= 0.75 * len(steps), kinds  # the first steps may precede everyone's ONLINE
    # Pairs, or one group of three while a view holds an odd count (a worker not ONLINE yet).
    assert all(1 <= len(e["group"]) <= 2 for e in steps.values() if e["kind"] == "matched")
    assert all(e["delay"] == 0 for e in steps.values()) if not overlap else max(delays) >= 1
    if pairing == "ready":  # partners may be at different steps: every use is returned, and Σ c = 0 overall
        used = {name: [ids[u] for (who, _), e in steps.items() if who == name for u in _full(ids, e["used"])]
                for name in ids.values()}
        assert one_sided_share(used) == 0.0, used
        matched = [e for e in steps.values() if "correction_sum" in e]
        assert abs(sum(e["correction_sum"] for e in matched)) <= 1e-4 * sum(e["correction_abs"] for e in matched)
        return
    # Workers that partitioned the same view (its digest in the log) computed the same
    # partition: a partner drawn from it names us back, always (or says it left us out as
    # recently unreachable: `avoided`). Views differ while the
    # stage's membership changes (a join or a leave reaches each view at its next refresh, and
    # a step's partition is drawn when each worker gets there), so groups drawn from different
    # views are counted and shown, not held to it.
    agreeing, differing = Counter(), Counter()
    for (name, k), event in steps.items():
        for partner in _full(ids, event["group"]):
            theirs = steps.get((ids[partner], k))
            if theirs is None or (ids[partner], k) in never_taken:
                continue
            named_back = name in [ids[i] for i in _full(ids, theirs["group"] + theirs.get("avoided", []))]
            (agreeing if theirs["view"] == event["view"] else differing)[named_back] += 1
    print(f"partner names us back, same view: {dict(agreeing)}; different views: {dict(differing)}; "
          f"steps jumped over {sorted(never_taken)}")
    assert agreeing[False] == 0 and agreeing[True] >= 8, (agreeing, differing)
    _assert_mean_kept(steps)


def _full(ids: dict[str, str], short_ids: list[str]) -> list[str]:
    return [next(i for i in ids if i.startswith(short)) for short in short_ids]


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


def test_sparse_rounds_keep_the_mean_send_little_and_checkpoint_what_is_unsent(tmp_path):
    """worker.delta_codec in real processes: rounds that are not a multiple of theta_every
    carry the outer gradient alone, sparse (noloco_rt/outer/delta_exchange.py); both kinds
    keep the pair's mean (Σ c = 0); the final checkpoint holds what is still unsent."""
    # Each step idles 3x its compute (worker.fault_slowdown): alone, 45 steps took 2.4 s, and a
    # partner that took 2.4 s longer to start found the first one finished (no step matched).
    cluster = LocalCluster(tmp_path, stages=1, settings={"outer.h": 5, "outer.overlap": False,
                                                         "worker.delta_codec": "topk2-zstd", "worker.theta_every": 3,
                                                         "worker.snapshot_chunk_mb": 0.05, "worker.fault_slowdown": 4.0})
    try:
        workers = [cluster.start_worker(0, f"w{i}", steps=45) for i in range(2)]
        for worker in workers:
            assert cluster.wait_exit(worker, timeout_s=240) == 0
        assert cluster.error_events() == []
        by_step: dict[int, list[dict]] = defaultdict(list)
        for worker in workers:
            for event in worker.events("outer_step_done"):
                by_step[event["outer_step"]].append(event)
    finally:
        cluster.close()
    both = {k: events for k, events in by_step.items() if len(events) == 2 and all(e["kind"] == "matched" for e in events)}
    sparse = [k for k in both if k % 3]
    # Steps before the second worker is ONLINE are local (it may start a few steps late).
    assert sparse and any(k % 3 == 0 for k in both), sorted(by_step)
    for k, events in both.items():
        assert {e["codec"] for e in events} == {"int8-zstd" if k % 3 == 0 else "topk2-zstd"}
        total, size = sum(e["correction_sum"] for e in events), sum(e["correction_abs"] for e in events)
        assert size > 0 and abs(total) <= 1e-5 * size, (k, total, size)
        if k % 3:  # 64 of every 4,096 entries at 2 bits, with their indices
            assert all(e["wire_bytes"] * 50 < e["raw_bytes"] for e in events), events
    final = max(by_step)
    state = load_checkpoint(tmp_path / "checkpoints" / "w0.pt", run_id="default", stage=0)
    if final % 3:  # the last round was sparse: its unsent part is kept
        assert [tuple(r.shape) for r in state["error_feedback"]] == [tuple(t.shape) for t in state["slow"]]
