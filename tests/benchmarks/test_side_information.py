"""benchmarks.side_information's arithmetic: what a partner's θ is worth to a receiver holding
its own, and that the modulo code it runs gives back what the simulator's int8-zstd exchange does."""

from __future__ import annotations

import math

import torch

from benchmarks.side_information import CodeBytes, code_pair, entropy_bits, int8_codes, pair_bits
from noloco_rt.outer.codecs.quantized import dequantize
from noloco_rt.outer.formula import PeerOuterState
from noloco_rt.simulation.lossy_exchange import as_received, exchange_generator


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


def test_the_codes_it_sends_are_the_simulators_int8_exchange_and_arrive_whole():
    generator = torch.Generator().manual_seed(3)
    sender = [0.05 * torch.randn(40, 33, generator=generator), 0.05 * torch.randn(130, generator=generator)]
    receiver = [t + 0.002 * torch.randn(t.shape, generator=generator) for t in sender]
    drawn = int8_codes(sender, exchange_generator(0, 1, 2, 7))
    simulated = as_received(PeerOuterState(fast=sender), "int8-zstd", exchange_generator(0, 1, 2, 7))
    for (scales, codes), received in zip(drawn, simulated.fast, strict=True):
        assert torch.equal(dequantize(scales, codes), received.reshape(-1))
    fixed = {3: CodeBytes(), 4: CodeBytes()}
    costs = code_pair(drawn, receiver, fixed)  # asserts the receiver ends with int8's values
    assert sum(c[4] for c in costs) == fixed[4].wire and sum(c[3] for c in costs) == fixed[3].wire
    assert fixed[4].float32 == 4 * (40 * 33 + 130) and fixed[4].blocks == 21 + 3
