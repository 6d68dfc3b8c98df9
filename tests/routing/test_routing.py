from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from noloco_rt.outer.matching import draw_groups, step_rng
from noloco_rt.routing.balanced import SLOW_FACTOR, DealSlot, balanced_next_hop, step_permutation
from noloco_rt.routing.next_hop import (
    UNMEASURED_RTT_S,
    exploration_rtt,
    next_hop_cost,
    next_hop_costs,
    route_next_hop,
)
from noloco_rt.simulation.paths import balanced_routes, load_aware_routes, random_peers


def test_p2c_prefers_the_shorter_queue():
    rng = random.Random(0)
    picks = Counter(route_next_hop([("a", 0), ("b", 9)], rng, "p2c") for _ in range(200))
    assert picks == {"a": 200}  # with two candidates both are always drawn


def test_p2c_spreads_load_better_than_random():
    def max_load(policy: str) -> int:
        rng = random.Random(1)
        load = [0] * 16
        for _ in range(16 * 16):
            pick = route_next_hop([(j, load[j]) for j in range(16)], rng, policy)
            load[pick] += 1
        return max(load)

    assert max_load("p2c") < max_load("random")


def test_random_policy_reaches_every_candidate():
    rng = random.Random(2)
    picks = {route_next_hop([(j, 0) for j in range(4)], rng, "random") for _ in range(200)}
    assert picks == {0, 1, 2, 3}


def test_route_errors():
    with pytest.raises(ValueError, match="no live next-stage worker"):
        route_next_hop([], random.Random(0))
    with pytest.raises(ValueError, match="unknown routing policy"):
        route_next_hop([(0, 0), (1, 0)], random.Random(0), "round-robin")


def test_next_hop_cost_grows_with_rtt_inflight_and_advertised_depth():
    base = next_hop_cost(0.1, 1, 2, explore_rtt_s=1.0)
    assert base == pytest.approx(0.1 * (1 + 1 + 0.25 * 2))
    assert next_hop_cost(0.2, 1, 2, explore_rtt_s=1.0) > base
    assert next_hop_cost(0.1, 2, 2, explore_rtt_s=1.0) > base
    assert next_hop_cost(0.1, 1, 3, explore_rtt_s=1.0) > base
    # The advertised depth is a hint: one more microbatch of our own weighs more than one advertised.
    assert next_hop_cost(0.1, 2, 2, explore_rtt_s=1.0) > next_hop_cost(0.1, 1, 3, explore_rtt_s=1.0)
    # A never-measured peer is costed at the exploration RTT; a zero RTT still counts in-flight work.
    assert next_hop_cost(None, 1, 2, explore_rtt_s=0.1) == base
    assert next_hop_cost(0.0, 3, 0, explore_rtt_s=1.0) > next_hop_cost(0.0, 0, 0, explore_rtt_s=1.0)


def test_an_unmeasured_peer_looks_as_fast_as_the_best_measured_one():
    assert exploration_rtt([0.3, None, 0.05, 0.2]) == 0.05
    assert exploration_rtt([None, None]) == UNMEASURED_RTT_S
    costs = dict(next_hop_costs([("slow", 0.3, 0, 0), ("fast", 0.05, 0, 0), ("new", None, 0, 0)]))
    assert costs["new"] == costs["fast"] < costs["slow"]


def test_a_newcomer_receives_traffic_until_it_is_measured():
    rng = random.Random(4)
    picks = Counter(route_next_hop(next_hop_costs([("old", 0.05, 0, 0), ("new", None, 0, 0)]), rng, "p2c")
                    for _ in range(100))
    assert picks["new"] > 20  # a tie with the best peer: taken whenever drawn first


def test_p2c_on_costs_sends_more_to_the_faster_peer():
    """Closed loop: each pick adds one in flight; the slow peer only pays off once the fast one is busy."""
    rng = random.Random(5)
    inflight = {"fast": 0, "slow": 0}
    rtt = {"fast": 0.01, "slow": 0.1}
    for _ in range(55):
        pick = route_next_hop(next_hop_costs([(p, rtt[p], inflight[p], 0) for p in inflight]), rng, "p2c")
        inflight[pick] += 1
    assert inflight["fast"] > 5 * inflight["slow"] > 0


@given(fast_rtt=st.floats(1e-4, 10.0), extra=st.floats(1e-4, 10.0), inflight=st.integers(0, 50),
       depth=st.integers(0, 50), others=st.lists(st.tuples(st.one_of(st.none(), st.floats(1e-4, 10.0)),
                                                           st.integers(0, 50), st.integers(0, 50)), max_size=4),
       seed=st.integers(0, 10**6))
def test_p2c_never_prefers_the_slower_of_two_drawn_peers_with_equal_inflight(fast_rtt, extra, inflight, depth,
                                                                            others, seed):
    peers = [("fast", fast_rtt, inflight, depth), ("slow", fast_rtt + extra, inflight, depth)]
    peers += [(f"other{i}", rtt, n, d) for i, (rtt, n, d) in enumerate(others)]
    costs = next_hop_costs(peers)
    assert costs[0][1] < costs[1][1]
    # With only these two, both are always drawn: the slower is never picked.
    rng = random.Random(seed)
    assert all(route_next_hop(costs[:2], rng, "p2c") == "fast" for _ in range(5))
    # Among more candidates, p2c drawing both of them picks the faster one.
    draw = random.Random(seed)
    first, second = draw.sample(range(len(costs)), 2) if len(costs) > 1 else (0, 0)
    if {first, second} == {0, 1}:
        assert route_next_hop(costs, random.Random(seed), "p2c") == "fast"


@given(replicas=st.integers(1, 12), group_size=st.integers(2, 4), seed=st.integers(0, 1000))
def test_noloco_groups_partition_the_stage(replicas, group_size, seed):
    groups = draw_groups(replicas, "noloco", group_size, random.Random(seed))
    for i, members in enumerate(groups):
        assert members[0] == i
        assert len(set(members)) == len(members)
        # membership is symmetric: a partition
        for j in members:
            assert sorted(groups[j]) == sorted(members)
        if replicas >= group_size:
            assert group_size <= len(members) < 2 * group_size
        else:
            assert len(members) == replicas


def test_noloco_groups_are_redrawn():
    rng = random.Random(3)
    draws = {tuple(map(tuple, draw_groups(8, "noloco", 2, rng))) for _ in range(20)}
    assert len(draws) > 10


def test_diloco_and_local_groups():
    assert draw_groups(3, "diloco", 2, random.Random(0)) == [[0, 1, 2], [1, 0, 2], [2, 0, 1]]
    assert draw_groups(3, "local", 2, random.Random(0)) == [[0], [1], [2]]
    with pytest.raises(ValueError):
        draw_groups(3, "ddp", 2, random.Random(0))


def _is_matching(groups: list[list[int]]) -> bool:
    """Everyone's group is the group of each of its members (partners choose each other)."""
    return all(sorted(groups[j]) == sorted(members) for members in groups for j in members)


def test_random_peer_is_not_a_matching_while_matched_groups_are():
    assert all(_is_matching(draw_groups(4, "noloco", 2, random.Random(seed))) for seed in range(20))
    one_sided = [seed for seed in range(20) if not _is_matching(random_peers(4, random.Random(seed)))]
    assert one_sided  # some seed draws a peer that does not draw back
    groups = random_peers(4, random.Random(one_sided[0]))
    assert any(groups[groups[i][1]][1] != i for i in range(4))


@given(replicas=st.integers(2, 9), seed=st.integers(0, 1000))
def test_random_peer_picks_one_other_replica(replicas, seed):
    groups = random_peers(replicas, random.Random(seed))
    assert [members[0] for members in groups] == list(range(replicas))
    assert all(len(members) == 2 and members[1] != members[0] for members in groups)
    assert all(0 <= members[1] < replicas for members in groups)


def test_random_peer_is_uniform_over_the_others_and_may_leave_a_replica_out():
    rng = random.Random(0)
    draws = [random_peers(4, rng) for _ in range(3000)]
    picked_by_0 = Counter(groups[0][1] for groups in draws)
    assert set(picked_by_0) == {1, 2, 3} and min(picked_by_0.values()) > 900  # 1000 each expected
    assert any(len({members[1] for members in groups}) < 4 for groups in draws)  # someone unused
    assert random_peers(1, rng) == [[0]]
    with pytest.raises(ValueError):
        random_peers(0, rng)


@given(replicas=st.integers(1, 9), stages=st.integers(1, 5), per_replica=st.integers(1, 6), seed=st.integers(0, 10**6))
def test_balanced_routes_give_every_replica_exactly_its_share(replicas, stages, per_replica, seed):
    paths = balanced_routes(replicas, stages, per_replica, random.Random(seed))
    assert len(paths) == replicas * per_replica
    for k, path in enumerate(paths):
        assert len(path) == stages
        assert path[0] == k // per_replica  # every path starts at its origin, origins in order
        assert all(0 <= index < replicas for index in path)
    for stage in range(stages):
        assert Counter(path[stage] for path in paths) == {r: per_replica for r in range(replicas)}


def test_balanced_routes_are_seeded_permutations():
    def draw(seed: int, step: int) -> list[list[int]]:
        return balanced_routes(4, 3, 2, step_rng(seed, step, "route"))

    assert draw(0, 5) == draw(0, 5)  # a function of (seed, step)
    assert len({str(draw(0, step)) for step in range(20)}) > 15  # redrawn every step
    assert draw(0, 5) != draw(1, 5)
    with pytest.raises(ValueError, match="per_replica"):
        balanced_routes(2, 2, 0, random.Random(0))


@pytest.mark.parametrize("policy", ["p2c", "random"])
def test_load_aware_routes_can_leave_a_replica_without_work(policy):
    """The old routing: hop by hop, so some replica-steps receive nothing (why the
    simulator balances by default)."""
    starved = 0
    for step in range(50):
        paths = load_aware_routes(8, 2, 1, step_rng(0, step, "route"), policy)
        assert [path[0] for path in paths] == list(range(8))
        starved += 8 - len({path[1] for path in paths})
    assert starved > 0


# -- the balanced deal (noloco_rt/routing/balanced.py) -------------------------------------

def _deal(senders: int, per_sender: int, receivers: int, step: int) -> Counter:
    """Microbatches each receiver gets at `step` when every sender deals its whole share."""
    return Counter(DealSlot(seed=7, stage=0, step=step, sender_rank=r, per_sender=per_sender, index=j).receiver(receivers)
                   for r in range(senders) for j in range(per_sender))


@given(senders=st.integers(1, 8), per_sender=st.integers(1, 6), receivers=st.integers(1, 8), step=st.integers(1, 10_000))
def test_the_deal_gives_every_receiver_its_share_of_each_step_within_one(senders, per_sender, receivers, step):
    got = _deal(senders, per_sender, receivers, step)
    total = senders * per_sender
    shares = [got.get(k, 0) for k in range(receivers)]
    assert sum(shares) == total
    assert max(shares) - min(shares) <= 1, shares  # p2c left a replica of a 2 x 4 run with 55 of 60 steps' worth


def test_the_deal_is_exact_when_the_step_divides_evenly_and_mixes_who_feeds_whom():
    assert _deal(4, 2, 4, step=3) == {0: 2, 1: 2, 2: 2, 3: 2}
    # Sender 0's first microbatch goes to a different receiver from step to step: every
    # receiver is fed by every sender over a run (a fixed pairing would not mix the data).
    first_hops = {DealSlot(seed=7, stage=0, step=t, sender_rank=0, per_sender=2, index=0).receiver(4) for t in range(1, 40)}
    assert first_hops == {0, 1, 2, 3}


def test_senders_of_one_stage_share_the_permutation_and_stages_differ():
    assert step_permutation(1, 0, 5, 6) == step_permutation(1, 0, 5, 6)
    assert sorted(step_permutation(1, 0, 5, 6)) == list(range(6))
    assert any(step_permutation(1, 0, t, 6) != step_permutation(1, 1, t, 6) for t in range(1, 10))
    with pytest.raises(ValueError, match="no receiver"):
        DealSlot(seed=1, stage=0, step=1, sender_rank=0, per_sender=1, index=0).receiver(0)


def test_a_slow_dealt_worker_is_passed_over_for_the_load_aware_choice():
    slot = DealSlot(seed=3, stage=0, step=1, sender_rank=0, per_sender=1, index=0)
    peers = ["a", "b"]
    dealt = peers[slot.receiver(2)]
    other = peers[1 - slot.receiver(2)]
    even = [(p, 0.1) for p in peers]
    assert balanced_next_hop(even, slot, random.Random(0)) == (dealt, False)
    near = [(p, 0.25 if p == dealt else 0.1) for p in peers]  # 2.5x: within SLOW_FACTOR, still dealt
    assert balanced_next_hop(near, slot, random.Random(0)) == (dealt, False)
    slow = [(p, 10 * SLOW_FACTOR if p == dealt else 1.0) for p in peers]
    assert balanced_next_hop(slow, slot, random.Random(0)) == (other, True)
    with pytest.raises(ValueError, match="no live"):
        balanced_next_hop([], slot, random.Random(0))
