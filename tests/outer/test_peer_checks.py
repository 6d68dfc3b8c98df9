from __future__ import annotations

import math

import pytest
import torch

from noloco_rt.outer.formula import PeerOuterState
from noloco_rt.outer.peer_checks import check_peer_distance, distance_ratio


def test_distance_ratio_exact_values():
    own = [torch.tensor([3.0, 0.0]), torch.tensor([[0.0, 4.0]])]  # ‖own‖ = 5
    peer = [torch.tensor([3.0, 1.0]), torch.tensor([[0.0, 4.0]])]  # distance 1
    assert distance_ratio(peer, own, own) == pytest.approx(0.2)
    assert distance_ratio(own, own, own) == 0.0
    assert distance_ratio([t * 1e6 for t in own], own, own) == pytest.approx(1e6 - 1)


def test_distance_ratio_is_inf_for_non_finite_or_other_shapes():
    own = [torch.ones(3)]
    assert distance_ratio([torch.tensor([1.0, math.nan, 1.0])], own, own) == math.inf
    assert distance_ratio([torch.tensor([1.0, math.inf, 1.0])], own, own) == math.inf
    assert distance_ratio([torch.ones(4)], own, own) == math.inf
    assert distance_ratio([torch.ones(3), torch.ones(1)], own, own) == math.inf


def test_zero_own_weights_do_not_divide_by_zero():
    zeros = [torch.zeros(2)]
    assert distance_ratio(zeros, zeros, zeros) == 0.0
    assert distance_ratio([torch.ones(2)], zeros, zeros) > 1e9


def test_fast_check_accepts_close_and_rejects_far():
    own = PeerOuterState(fast=[torch.ones(10)])
    close = PeerOuterState(fast=[torch.ones(10) * 1.01])
    far = PeerOuterState(fast=[torch.ones(10) * 1e6])
    assert check_peer_distance(close, own, max_ratio=0.5).ok
    result = check_peer_distance(far, own, max_ratio=0.5)
    assert not result.ok and result.ratios["fast"] == pytest.approx(1e6 - 1)


def test_slow_and_grad_are_checked_separately_against_the_weight_scale():
    slow = [torch.ones(4) * 2.0]  # ‖φ‖ = 4
    own = PeerOuterState(slow=slow, outer_grad=[torch.full((4,), 0.01)])
    honest = PeerOuterState(slow=[torch.ones(4) * 2.01], outer_grad=[torch.full((4,), -0.01)])
    check = check_peer_distance(honest, own, max_ratio=0.5)
    assert check.ok and set(check.ratios) == {"slow", "outer_grad"}
    assert check.ratios["outer_grad"] == pytest.approx(0.04 / 4)
    # Sane slow weights but a huge outer gradient: only the gradient part trips the bound.
    poisoned = PeerOuterState(slow=slow, outer_grad=[torch.full((4,), 100.0)])
    check = check_peer_distance(poisoned, own, max_ratio=0.5)
    assert not check.ok and check.ratios["slow"] == 0.0 and check.ratios["outer_grad"] > 20


def test_a_peer_of_the_other_kind_is_infinitely_far():
    fast_only = PeerOuterState(fast=[torch.ones(2)])
    full = PeerOuterState(slow=[torch.ones(2)], outer_grad=[torch.zeros(2)])
    assert not check_peer_distance(full, fast_only, max_ratio=1e30).ok
    assert not check_peer_distance(fast_only, full, max_ratio=1e30).ok
