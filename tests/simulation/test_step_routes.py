"""The simulator's routing of one inner step (pure)."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from noloco_rt.simulation.paths import site_of
from noloco_rt.simulation.step_routes import group_by_path, plan_step


def test_group_by_path_keeps_first_appearance_order():
    assert group_by_path([[0, 1], [0, 2], [0, 1], [0, 0]]) == [((0, 1), (0, 2)), ((0, 2), (1,)), ((0, 0), (3,))]


def _sequences_per_replica(plan, stages: int) -> list[Counter]:
    counts = [Counter() for _ in range(stages)]
    for hop in plan.hops:
        for stage, index in enumerate(hop.path):
            counts[stage][index] += len(hop.rows)
    return counts


@given(routing=st.sampled_from(["balanced", "balanced-sequence", "fixed"]), replicas=st.integers(1, 6),
       stages=st.integers(1, 4), microbatches=st.integers(1, 3), batch_size=st.integers(1, 5),
       seed=st.integers(0, 10**6))
def test_balanced_plans_give_every_replica_batch_size_times_microbatches_sequences(
        routing, replicas, stages, microbatches, batch_size, seed):
    plan = plan_step(routing, replicas=replicas, stages=stages, microbatches=microbatches,
                     batch_size=batch_size, rng=random.Random(seed))
    share = microbatches * batch_size
    for counts in _sequences_per_replica(plan, stages):
        assert counts == {r: share for r in range(replicas)}
    assert plan.grads_are_means
    # every row of every microbatch is routed exactly once, from its own origin
    rows = Counter((hop.origin, hop.microbatch, row) for hop in plan.hops for row in hop.rows)
    assert rows == {(o, m, b): 1 for o in range(replicas) for m in range(microbatches) for b in range(batch_size)}
    assert all(hop.path[0] == hop.origin for hop in plan.hops)
    # a pass's mean loss times its weight gives each of its sequences the coefficient
    # 1/share, so a replica's summed gradient is the mean over the share it processed
    assert all(hop.loss_weight / len(hop.rows) == pytest.approx(1 / share) for hop in plan.hops)


@given(sites=st.integers(1, 3), per_site=st.integers(1, 4), stages=st.integers(1, 4), microbatches=st.integers(1, 4),
       far_share=st.sampled_from([0.0, 0.1, 0.25, 0.5, 1.0]), seed=st.integers(0, 10**6))
def test_local_plans_are_balanced_and_cross_sites_at_the_asked_share(sites, per_site, stages, microbatches,
                                                                     far_share, seed):
    replicas = sites * per_site
    plan = plan_step("local", replicas=replicas, stages=stages, microbatches=microbatches, batch_size=2,
                     rng=random.Random(seed), sites=sites, far_share=far_share)
    for counts in _sequences_per_replica(plan, stages):
        assert counts == {r: 2 * microbatches for r in range(replicas)}
    assert plan.grads_are_means and all(hop.path[0] == hop.origin for hop in plan.hops)
    share = far_share * per_site * microbatches if sites > 1 else 0.0
    for stage in range(1, stages):
        crossed = sum(site_of(hop.path[stage], replicas, sites) != site_of(hop.path[stage - 1], replicas, sites)
                      for hop in plan.hops)
        assert crossed in {sites * math.floor(share), sites * math.ceil(share)}, (crossed, share)


def test_few_units_a_site_still_cross_at_the_asked_share_on_average():
    """4 replicas a site, one microbatch each: 0.1 of 4 units is no whole unit, yet a tenth
    of them cross over many steps (a rounded count would cross none)."""
    rng = random.Random(7)
    crossed = 0
    for _ in range(2000):
        plan = plan_step("local", replicas=8, stages=2, microbatches=1, batch_size=1, rng=rng, sites=2, far_share=0.1)
        crossed += sum(site_of(hop.path[1], 8, 2) != site_of(hop.path[0], 8, 2) for hop in plan.hops)
    assert 0.085 <= crossed / (2000 * 8) <= 0.115, crossed


def test_local_routing_refuses_unequal_sites_and_a_share_outside_0_1():
    with pytest.raises(ValueError, match="do not split into 3 equal sites"):
        plan_step("local", replicas=4, stages=2, microbatches=1, batch_size=1, rng=random.Random(0), sites=3)
    with pytest.raises(ValueError, match="far_share must be in"):
        plan_step("local", replicas=4, stages=2, microbatches=1, batch_size=1, rng=random.Random(0), sites=2,
                  far_share=1.5)


def test_per_sequence_plans_split_microbatches():
    plan = plan_step("balanced-sequence", replicas=4, stages=2, microbatches=1, batch_size=8, rng=random.Random(0))
    assert len(plan.hops) > 4  # some microbatch went to more than one next-stage replica
    assert sum(len(hop.rows) for hop in plan.hops) == 32


def test_p2c_plans_are_whole_microbatches_divided_by_what_arrived():
    plan = plan_step("p2c", replicas=3, stages=2, microbatches=2, batch_size=4, rng=random.Random(0))
    assert not plan.grads_are_means
    assert [(hop.origin, hop.microbatch) for hop in plan.hops] == [(o, m) for o in range(3) for m in range(2)]
    assert all(hop.rows == (0, 1, 2, 3) and hop.loss_weight == 1.0 for hop in plan.hops)


def test_fixed_plans_keep_every_microbatch_on_its_origins_column():
    plan = plan_step("fixed", replicas=3, stages=3, microbatches=2, batch_size=4, rng=random.Random(0))
    assert [hop.path for hop in plan.hops] == [(o, o, o) for o in range(3) for _ in range(2)]
    assert [hop.microbatch for hop in plan.hops] == [0, 1] * 3


def test_unknown_routing():
    with pytest.raises(ValueError, match="unknown simulator routing 'round-robin'"):
        plan_step("round-robin", replicas=2, stages=2, microbatches=1, batch_size=1, rng=random.Random(0))
