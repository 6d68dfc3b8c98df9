"""Matched outer-step groups and the provisional step's exact correction (docs/architecture.md §4): pure
functions, tested directly."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from noloco_rt.outer.correction import (
    apply_correction,
    correction_term,
    deferred_outer_step,
    pair_group_size,
    provisional_local_step,
)
from noloco_rt.outer.formula import OuterCoefficients, PeerOuterState, group_outer_step
from noloco_rt.outer.matching import matched_partners, partition, view_digest


def ids(n: int) -> list[str]:
    return [f"w{i:03d}" for i in range(n)]


# -- matched groups -------------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 40), group_size=st.integers(2, 4), step=st.integers(0, 10_000), seed=st.integers(0, 99))
def test_every_member_is_in_exactly_one_group_and_partners_choose_each_other(n, group_size, step, seed):
    members = ids(n)
    groups = partition(members, seed=seed, stage=0, outer_step=step, group_size=group_size)
    assert sorted(m for g in groups for m in g) == members  # a partition
    assert all(len(g) >= min(n, group_size) for g in groups)
    assert all(len(g) < 2 * group_size for g in groups) or n < 2 * group_size
    for me in members:
        partners = matched_partners(members, me, seed=seed, stage=0, outer_step=step, group_size=group_size)
        for partner in partners:  # symmetric: no one-sided pairs
            back = matched_partners(members, partner, seed=seed, stage=0, outer_step=step, group_size=group_size)
            assert me in back


def test_workers_with_the_same_view_agree_whatever_its_order():
    members = ids(9)
    shuffled = members[:]
    random.Random(3).shuffle(shuffled)
    for me in members:
        assert (matched_partners(members, me, seed=1, stage=2, outer_step=7, group_size=2)
                == matched_partners(shuffled, me, seed=1, stage=2, outer_step=7, group_size=2))


def test_a_views_digest_ignores_order_and_repeats_and_tells_views_apart():
    view = [f"w{i}" for i in range(6)]
    assert view_digest(view) == view_digest(list(reversed(view)) + view[:2])
    assert len(view_digest(view)) == 8
    assert len({view_digest(view), view_digest(view[:-1]), view_digest([*view, "w6"]), view_digest([])}) == 4


def test_groups_are_redrawn_every_step_and_differ_between_stages():
    members = ids(16)
    by_step = {tuple(map(tuple, partition(members, seed=0, stage=0, outer_step=k, group_size=2))) for k in range(10)}
    assert len(by_step) == 10
    assert (partition(members, seed=0, stage=0, outer_step=5, group_size=2)
            != partition(members, seed=0, stage=1, outer_step=5, group_size=2))


def test_an_odd_stage_forms_one_group_of_three_and_a_lone_worker_steps_alone():
    groups = partition(ids(5), seed=0, stage=0, outer_step=0, group_size=2)
    assert sorted(len(g) for g in groups) == [2, 3]
    assert matched_partners(["only"], "only", seed=0, stage=0, outer_step=0, group_size=2) == []


def test_a_worker_outside_its_own_view_has_no_partition():
    with pytest.raises(ValueError, match="not among"):
        matched_partners(ids(4), "stranger", seed=0, stage=0, outer_step=0, group_size=2)


# -- provisional local step and its correction -------------------------------------------------------

def replica(seed: int, shapes=((5, 3), (7,))) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    slow = [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]
    fast = [s + 0.1 * torch.randn(s.shape, generator=g, dtype=torch.float64) for s in slow]
    momentum = [0.05 * torch.randn(s.shape, generator=g, dtype=torch.float64) for s in slow]
    return slow, momentum, fast


def copies(state):
    return tuple([t.clone() for t in part] for part in state)


@pytest.mark.parametrize("coeffs", [OuterCoefficients(alpha=0.5, beta=0.7, gamma=0.7),
                                    OuterCoefficients(alpha=0.3, beta=0.7, gamma=0.0),
                                    OuterCoefficients(alpha=0.5, beta=0.7, gamma=0.2)],
                         ids=["shortcut", "diloco-like", "general"])
def test_provisional_step_then_correction_equals_the_blocking_group_step(coeffs):
    me, partners = replica(0), [replica(s) for s in (1, 2)]
    theta_only = coeffs.theta_shortcut
    partner_states = [PeerOuterState.of(fast, slow, theta_only=theta_only) for slow, _, fast in partners]

    blocking = copies(me)
    group_outer_step(*blocking, partner_states, coeffs)

    overlapped = copies(me)
    own_at_k = provisional_local_step(*overlapped, coeffs)
    apply_correction(*overlapped, correction_term(own_at_k, partner_states, coeffs))

    for got, want in zip(overlapped, blocking, strict=True):
        for g, w in zip(got, want, strict=True):
            assert torch.allclose(g, w, rtol=0, atol=1e-12)


def test_a_late_correction_keeps_the_inner_progress_made_meanwhile():
    coeffs = OuterCoefficients(alpha=0.5, beta=0.7, gamma=0.7)
    me, partner = replica(0), replica(1)
    partner_state = [PeerOuterState.of(partner[2], partner[0], theta_only=True)]
    blocking = copies(me)
    group_outer_step(*blocking, partner_state, coeffs)

    slow, momentum, fast = copies(me)
    own_at_k = provisional_local_step(slow, momentum, fast, coeffs)
    progress = [0.01 * torch.ones_like(f) for f in fast]
    torch._foreach_add_(fast, progress)  # inner steps taken before the partner's snapshot arrived
    apply_correction(slow, momentum, fast, correction_term(own_at_k, partner_state, coeffs))
    for f, b, p in zip(fast, blocking[2], progress, strict=True):
        assert torch.allclose(f, b + p, rtol=0, atol=1e-12)
    for s, b in zip(slow, blocking[0], strict=True):
        assert torch.allclose(s, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("coeffs", [OuterCoefficients(alpha=0.5, beta=0.7, gamma=0.7),
                                    OuterCoefficients(alpha=0.5, beta=0.7, gamma=0.2)], ids=["shortcut", "general"])
def test_a_deferred_step_is_the_group_step_with_the_inner_progress_since_step_k(coeffs):
    me, partners = replica(0), [replica(s) for s in (1, 2)]
    partner_states = [PeerOuterState.of(fast, slow, theta_only=coeffs.theta_shortcut) for slow, _, fast in partners]
    blocking = copies(me)
    group_outer_step(*blocking, partner_states, coeffs)

    slow, momentum, fast = copies(me)
    own_at_k = PeerOuterState.of([f.clone() for f in fast], [s.clone() for s in slow],
                                 theta_only=coeffs.theta_shortcut)
    fast_at_k = [f.clone() for f in fast]
    progress = [0.01 * torch.arange(f.numel(), dtype=f.dtype).reshape(f.shape) for f in fast]
    torch._foreach_add_(fast, progress)  # inner steps taken before the partners' states arrived
    deferred_outer_step(slow, momentum, fast, fast_at_k, correction_term(own_at_k, partner_states, coeffs), coeffs)
    for got, want in ((slow, blocking[0]), (momentum, blocking[1])):
        for g, w in zip(got, want, strict=True):
            assert torch.allclose(g, w, rtol=0, atol=1e-12)
    for f, b, p in zip(fast, blocking[2], progress, strict=True):
        assert torch.allclose(f, b + p, rtol=0, atol=1e-12)


def test_a_deferred_step_without_partners_is_the_local_step():
    coeffs = OuterCoefficients(alpha=0.5, beta=0.7, gamma=0.7)
    local = copies(replica(0))
    group_outer_step(*local, [], coeffs)
    slow, momentum, fast = copies(replica(0))
    deferred_outer_step(slow, momentum, fast, [f.clone() for f in fast], None, coeffs)
    for got, want in zip((slow, momentum, fast), local, strict=True):
        for g, w in zip(got, want, strict=True):
            assert torch.allclose(g, w, rtol=0, atol=1e-12)


@pytest.mark.parametrize("coeffs", [OuterCoefficients(alpha=0.5, beta=0.7, gamma=0.7),
                                    OuterCoefficients(alpha=0.5, beta=0.7, gamma=0.2)], ids=["shortcut", "general"])
def test_a_partial_group_of_three_keeps_the_mean_where_every_pair_that_exchanged_cancels(coeffs):
    # a, b, c drew one group of three; a and c never exchanged (a push failed), a-b and b-c did.
    a, b, c = (replica(seed) for seed in (0, 1, 2))
    state = {name: PeerOuterState.of(fast, slow, theta_only=coeffs.theta_shortcut)
             for name, (slow, _, fast) in zip("abc", (a, b, c), strict=True)}
    used = {"a": ["b"], "b": ["a", "c"], "c": ["b"]}
    corrections = [correction_term(state[me], [state[p] for p in partners], coeffs, group_size=3)
                   for me, partners in used.items()]
    for parts in zip(*corrections, strict=True):
        assert torch.allclose(sum(parts), torch.zeros_like(parts[0]), rtol=0, atol=1e-12)
    # With every member in, the group's size is the count: the same c as without it.
    full = correction_term(state["a"], [state["b"], state["c"]], coeffs)
    for x, y in zip(full, correction_term(state["a"], [state["b"], state["c"]], coeffs, group_size=3), strict=True):
        assert torch.equal(x, y)


@pytest.mark.parametrize("coeffs", [OuterCoefficients(alpha=0.5, beta=0.7, gamma=0.7),
                                    OuterCoefficients(alpha=0.5, beta=0.7, gamma=0.2)], ids=["shortcut", "general"])
def test_a_pair_whose_views_differ_weighs_alike_on_both_sides_and_cancels(coeffs):
    # a's view still lists a member b has dropped: a computed {a, b, ghost} and used b alone;
    # b computed {b, a}. Each pair weighs by the larger size, so the two c cancel.
    a, b = (replica(seed) for seed in (0, 1))
    state = {name: PeerOuterState.of(fast, slow, theta_only=coeffs.theta_shortcut)
             for name, (slow, _, fast) in zip("ab", (a, b), strict=True)}
    size = pair_group_size(3, 2)
    assert size == pair_group_size(2, 3) == 3 and pair_group_size(2, None) == 2
    mended = [correction_term(state["a"], [state["b"]], coeffs, group_size=[size]),
              correction_term(state["b"], [state["a"]], coeffs, group_size=[size])]
    for parts in zip(*mended, strict=True):
        assert torch.equal(parts[0], -parts[1])
    # Each side by its own size (1/3 and 1/2) moves the mean: what this replaces.
    own_sizes = [correction_term(state["a"], [state["b"]], coeffs, group_size=3),
                 correction_term(state["b"], [state["a"]], coeffs, group_size=2)]
    assert any(not torch.allclose(x + y, torch.zeros_like(x), atol=1e-9) for x, y in zip(*own_sizes, strict=True))


@pytest.mark.parametrize("coeffs", [OuterCoefficients(alpha=0.5, beta=0.7, gamma=0.7),
                                    OuterCoefficients(alpha=0.5, beta=0.7, gamma=0.2)], ids=["shortcut", "general"])
def test_per_pair_sizes_that_agree_give_the_group_step_and_mixed_ones_weigh_each_pair(coeffs):
    a, b, c = (replica(seed) for seed in (0, 1, 2))
    state = [PeerOuterState.of(fast, slow, theta_only=coeffs.theta_shortcut) for slow, _, fast in (a, b, c)]
    same = correction_term(state[0], state[1:], coeffs, group_size=[3, 3])
    for x, y in zip(same, correction_term(state[0], state[1:], coeffs), strict=True):
        assert torch.equal(x, y)
    mixed = correction_term(state[0], state[1:], coeffs, group_size=[3, 4])
    by_pair = [correction_term(state[0], [state[1]], coeffs, group_size=[3]),
               correction_term(state[0], [state[2]], coeffs, group_size=[4])]
    for m, x, y in zip(mixed, *by_pair, strict=True):
        assert torch.allclose(m, x + y, rtol=0, atol=1e-6)


def test_a_correction_refuses_no_partners_and_mixed_kinds():
    coeffs = OuterCoefficients(alpha=0.5, beta=0.7, gamma=0.7)
    slow, _, fast = replica(0)
    own = PeerOuterState.of(fast, slow, theta_only=True)
    with pytest.raises(ValueError, match="at least one"):
        correction_term(own, [], coeffs)
    with pytest.raises(ValueError, match="cannot hold"):
        correction_term(own, [own, own], coeffs, group_size=2)
    with pytest.raises(ValueError, match="cannot hold"):
        correction_term(own, [own, own], coeffs, group_size=[3, 2])
    with pytest.raises(ValueError, match="2 group sizes for 1"):
        correction_term(own, [own], coeffs, group_size=[2, 2])
    with pytest.raises(ValueError, match="mix"):
        correction_term(own, [PeerOuterState(slow=slow, outer_grad=fast)], coeffs)
    general = OuterCoefficients(alpha=0.5, beta=0.7, gamma=0.2)
    with pytest.raises(ValueError, match="gamma == beta"):
        correction_term(own, [own], general)
