"""Poisoned peers (real processes): a stage of one honest worker and two that serve bad
outer-step snapshots through the test-only fault settings (worker.fault_*). The honest
worker must reject both (too_far, non_finite), blacklist them, never apply what they
sent, and train on with finite weights."""

from __future__ import annotations

import math

import pytest
import torch

from noloco_rt.checkpoints.worker import load_checkpoint
from workers.cluster.local_cluster import LocalCluster

pytestmark = pytest.mark.timeout(120)


@pytest.mark.slow
def test_honest_worker_rejects_and_blacklists_poisoned_peers(tmp_path):
    # Lossless, so a NaN travels as a NaN (int8 refuses to quantise it and says "codec").
    cluster = LocalCluster(tmp_path, stages=1, settings={"worker.exchange_timeout_s": 2.0,
                                                         "worker.snapshot_codec": "shuffle-zstd"})
    try:
        good = cluster.start_worker(0, "good")
        cluster.wait_event(good, "member_online", timeout_s=30)
        scaled = cluster.start_worker(0, "scaled", **{"worker.fault_scale_snapshot": 1e6})
        nan = cluster.start_worker(0, "nan", **{"worker.fault_nan_snapshot": "true"})
        bad_ids = {w.name: cluster.wait_event(w, "worker_started", timeout_s=30)["worker"] for w in (scaled, nan)}

        def rejected_reasons() -> set[str]:
            return {e["reason"] for e in good.events("peer_snapshot_rejected")}

        cluster.wait_for(lambda: {"too_far", "non_finite"} <= rejected_reasons(), timeout_s=60,
                         what="the honest worker to reject both poisoned peers")
        before = good.latest_inner_step()
        cluster.wait_for(lambda: good.latest_inner_step() >= before + 10, timeout_s=30,
                         what="the honest worker to keep training")
        assert cluster.stop(good) == 0
    finally:
        cluster.close()

    rejections = good.events("peer_snapshot_rejected")
    by_peer = {e["peer"]: e["reason"] for e in rejections}
    assert by_peer.get(bad_ids["scaled"]) == "too_far", rejections
    assert by_peer.get(bad_ids["nan"]) == "non_finite", rejections
    assert all(e["blacklisted_s"] > 0 for e in rejections)
    far = [e for e in rejections if e["reason"] == "too_far"]
    assert all(max(e["ratios"].values()) > 1e5 for e in far), far
    # Nothing from a poisoned peer was ever applied.
    applied_from = {peer for e in good.events("outer_step_done") for peer in e["used"]}
    assert not applied_from & set(bad_ids.values()), applied_from
    summary = good.events("worker_summary")[-1]
    assert summary["rejected"].get("too_far", 0) >= 1 and summary["rejected"].get("non_finite", 0) >= 1
    losses = [e["loss"] for e in good.events("train_progress") if "loss" in e]
    assert losses and all(math.isfinite(loss) for loss in losses)
    state = load_checkpoint(tmp_path / "checkpoints" / "good.pt", run_id="default", stage=0)
    assert state is not None and state["counters"]["inner_steps"] >= before + 10
    for key in ("fast", "slow", "momentum"):
        assert all(bool(torch.isfinite(t).all()) for t in state[key]), key
    # Weights stay at the scale honest training gives (a 1e6-scaled average would not).
    assert max(float(t.abs().max()) for t in state["slow"]) < 100
