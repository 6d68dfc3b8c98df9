"""The chaos driver's fault schedule: seeded, and never breaks its placement rules."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.cluster.chaos_schedule import (
    ALL_KINDS,
    CLUSTER_FAULTS,
    FAULT_KINDS,
    REDIS_TARGET,
    Fault,
    build_schedule,
    violations,
)

WORKERS = {f"s{k}-r{j}": k for k in range(2) for j in range(3)}


def test_same_seed_same_schedule_other_seed_other_schedule():
    a = build_schedule(7, 60.0, 3.0, WORKERS)
    assert a == build_schedule(7, 60.0, 3.0, WORKERS)
    assert a != build_schedule(8, 60.0, 3.0, WORKERS)


def test_first_slots_cover_every_kind_then_the_rules_hold():
    faults = build_schedule(0, 30.0, 3.0, WORKERS, hold_s=2.0, recover_s=6.0)
    assert {f.kind for f in faults[:len(FAULT_KINDS)]} == set(FAULT_KINDS)
    assert all(f.at_s < 30.0 for f in faults) and [f.at_s for f in faults] == sorted(f.at_s for f in faults)
    assert violations(faults, WORKERS, 6.0) == []
    for fault in faults:
        assert fault.hold_s == (2.0 if fault.kind in ("sigstop", "redis_restart") else 0.0)
        assert (fault.target == REDIS_TARGET) == (fault.kind == "redis_restart")


def test_only_requested_kinds_and_unknown_kinds_are_refused():
    assert {f.kind for f in build_schedule(1, 40.0, 2.0, WORKERS, ["sigstop"])} == {"sigstop"}
    with pytest.raises(ValueError, match="net_jitter"):
        build_schedule(1, 40.0, 2.0, WORKERS, ["net_jitter"])


def test_violations_names_each_broken_rule():
    both = [Fault(1.0, "sigkill", "s0-r0"), Fault(2.0, "sigstop", "s0-r0", 1.0)]
    assert "overlaps" in violations(both, WORKERS, 5.0)[0]
    whole_stage = [Fault(1.0, "sigkill", f"s1-r{j}") for j in range(3)]
    assert any("stage 1 has no live worker" in v for v in violations(whole_stage, WORKERS, 5.0))
    redis_during_restart = [Fault(1.0, "sigterm", "s1-r0"), Fault(3.0, "redis_restart", REDIS_TARGET, 2.0)]
    assert "Redis outage overlaps" in violations(redis_during_restart, WORKERS, 5.0)[0]
    assert violations([Fault(1.0, "sigkill", "s0-r0"), Fault(7.0, "sigkill", "s0-r0")], WORKERS, 5.0) == []


def test_a_single_replica_stage_gets_no_worker_faults():
    lonely = {"s0-r0": 0, "s1-r0": 1}
    faults = build_schedule(3, 60.0, 3.0, lonely)
    assert faults and {f.kind for f in faults} == {"redis_restart"}


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), every_s=st.floats(0.5, 6.0), hold_s=st.floats(0.0, 5.0),
       recover_s=st.floats(0.0, 12.0), replicas=st.integers(1, 4))
def test_any_schedule_keeps_the_rules(seed, every_s, hold_s, recover_s, replicas):
    workers = {f"s{k}-r{j}": k for k in range(2) for j in range(replicas)}
    faults = build_schedule(seed, 40.0, every_s, workers, hold_s=hold_s, recover_s=recover_s)
    assert violations(faults, workers, recover_s) == []


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), every_s=st.floats(0.5, 3.0), hold_s=st.floats(0.0, 4.0),
       recover_s=st.floats(0.0, 6.0), replicas=st.integers(1, 3))
def test_any_schedule_of_every_kind_keeps_the_rules(seed, every_s, hold_s, recover_s, replicas):
    workers = {f"s{k}-r{j}": k for k in range(2) for j in range(replicas)}
    faults = build_schedule(seed, 120.0, every_s, workers, ALL_KINDS, hold_s=hold_s, recover_s=recover_s)
    assert violations(faults, workers, recover_s) == []
    assert {f.target for f in faults if f.kind in CLUSTER_FAULTS} <= {"redis", "network", "disk"}


def test_a_soak_gives_every_kind_its_share():
    """Partitions and Redis data loss exclude every other fault while they last: owed to later
    slots, they still get about their share of a long schedule (the soak needs 50 of each)."""
    faults = build_schedule(7, 1700.0, 0.75, WORKERS, ALL_KINDS, hold_s=2.0, recover_s=3.0)
    counts = Counter(f.kind for f in faults)
    assert len(faults) >= 1000 and violations(faults, WORKERS, 3.0) == []
    assert min(counts.values()) >= 0.5 * len(faults) / len(ALL_KINDS), counts
