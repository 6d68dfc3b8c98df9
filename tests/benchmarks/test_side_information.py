"""benchmarks.side_information's arithmetic: what a partner's θ is worth to a receiver holding its own."""

from __future__ import annotations

import math

import torch

from benchmarks.side_information import entropy_bits, pair_bits


def test_entropy_of_codes():
    assert entropy_bits(torch.zeros(100)) == 0.0
    assert math.isclose(entropy_bits(torch.arange(8).repeat(10)), 3.0)


def test_a_receiver_holding_the_same_weights_needs_nothing_and_a_far_one_needs_more():
    generator = torch.Generator().manual_seed(0)
    theta = torch.randn(64 * 256, generator=generator)
    same = pair_bits(theta, theta.clone())
    assert same.side == 0.0 and same.modulo == 0.0 and same.diff_steps_rms == 0.0
    assert same.plain > 5  # int8 codes of a Gaussian: most of the 8 bits
    step = theta.view(-1, 64).abs().amax(dim=1).mean() / 127
    near = pair_bits(theta, theta + 2 * step * torch.randn(theta.shape, generator=generator))
    far = pair_bits(theta, theta + 20 * step * torch.randn(theta.shape, generator=generator))
    assert 0 < near.side < far.side < far.plain + 1
    assert near.modulo < far.modulo
    assert 1 < near.diff_steps_rms < far.diff_steps_rms
