from __future__ import annotations

import math

import pytest
import torch

from noloco_rt.algo.diagnostics import perplexity, replica_spread


def test_spread_is_zero_for_identical_replicas():
    weights = [torch.randn(3, 4), torch.randn(5)]
    assert replica_spread([weights, [w.clone() for w in weights], [w.clone() for w in weights]]) == 0.0


def test_spread_matches_hand_computation():
    # Two replicas, P = 3 scalars over two tensors.
    r0 = [torch.tensor([1.0, 2.0]), torch.tensor([0.0])]
    r1 = [torch.tensor([3.0, 2.0]), torch.tensor([4.0])]
    # means: [2, 2], [2]; squared deviations: (1+1) + (0+0) + (4+4) = 10; R·P = 6
    assert replica_spread([r0, r1]) == pytest.approx(math.sqrt(10 / 6))


def test_spread_rejects_mismatched_replicas():
    with pytest.raises(ValueError):
        replica_spread([[torch.zeros(2)], [torch.zeros(2), torch.zeros(1)]])


def test_perplexity():
    assert perplexity(math.log(256)) == pytest.approx(256)
