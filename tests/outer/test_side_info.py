"""The modulo code of a partner's θ against the receiver's own (noloco_rt.outer.side_info)."""

from __future__ import annotations

import pytest
import torch

from noloco_rt.outer import side_info
from noloco_rt.outer.codecs.base import CodecError
from noloco_rt.outer.codecs.quantized import BLOCK_SIZE, block_count, dequantize, quantize

N = 64 * 120 + 37  # a short last block


def sender_codes(seed: int = 0, n: int = N) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    theta = 0.02 * torch.randn(n, generator=generator)
    scales, codes = quantize(theta, 127, generator)
    return theta, scales, codes


def nearby(theta: torch.Tensor, scales: torch.Tensor, steps: float, seed: int = 1) -> torch.Tensor:
    """A receiver's θ: the sender's plus noise of `steps` int8 steps (rms)."""
    step = scales.repeat_interleave(BLOCK_SIZE)[: theta.numel()]
    return theta + steps * step * torch.randn(theta.shape, generator=torch.Generator().manual_seed(seed))


def round_trip(scales, codes, reference, bits):
    code = side_info.encode(scales, codes, bits)
    resolved = side_info.resolve(code, reference)
    return code, resolved, side_info.repaired(code, resolved, side_info.repair_codes(codes, resolved.failed))


@pytest.mark.parametrize("steps,bits", [(0.0, 2), (1.8, 4), (1.8, 3), (6.0, 4), (40.0, 5)])
def test_the_receiver_ends_with_int8s_values_however_far_it_is(steps, bits):
    theta, scales, codes = sender_codes()
    code, resolved, values = round_trip(scales, codes, nearby(theta, scales, steps), bits)
    assert torch.equal(values, dequantize(scales, codes))
    if steps == 0.0:
        assert resolved.failed.numel() == 0
    if steps >= 6.0:
        assert resolved.failed.numel() > block_count(N) // 2  # far: most blocks travel again
    assert code.wire_bytes == block_count(N) * 8 + -(-N * bits // 8)


def test_a_near_receiver_gets_int8s_values_in_about_half_its_bytes():
    theta, scales, codes = sender_codes()
    code, resolved, _ = round_trip(scales, codes, nearby(theta, scales, 1.8), 4)
    assert resolved.failed.numel() < 0.02 * block_count(N)
    assert side_info.wire_bytes(code, resolved.failed.numel()) < 0.6 * side_info.int8_bytes(N)


def test_one_wrong_code_always_fails_its_blocks_check():
    theta, scales, codes = sender_codes()
    step = scales.repeat_interleave(BLOCK_SIZE)[:N]
    for position in (0, 5, 63, 64 * 7 + 20, N - 1):
        reference = theta.clone()
        reference[position] += 16 * step[position] * (1 if codes[position] < 0 else -1)  # off by one wrap
        resolved = side_info.resolve(side_info.encode(scales, codes, 4), reference)
        assert resolved.failed.tolist() == [position // BLOCK_SIZE]


def test_wrong_codes_that_a_linear_check_would_miss_are_caught():
    # +16 at i and j, -16 at i - d and j + d: weights linear in the position cancel exactly.
    codes = torch.zeros(BLOCK_SIZE, dtype=torch.int8)
    wrong = codes.clone()
    wrong[[10, 30]] = 16
    wrong[[5, 35]] = -16
    assert int(side_info.block_checks(codes)[0]) != int(side_info.block_checks(wrong)[0])


def test_a_zero_block_and_values_at_the_edge_of_the_range_resolve():
    theta = torch.zeros(3 * BLOCK_SIZE)
    theta[BLOCK_SIZE:2 * BLOCK_SIZE] = torch.linspace(-1, 1, BLOCK_SIZE)  # codes ±127 at the ends
    scales, codes = quantize(theta, 127, torch.Generator().manual_seed(0))
    code, resolved, values = round_trip(scales, codes, theta, 3)
    assert resolved.failed.numel() == 0 and torch.equal(values, dequantize(scales, codes))


def test_the_costs_the_receiver_reports_are_what_each_choice_would_have_sent():
    theta, scales, codes = sender_codes()
    for steps in (1.5, 12.0):
        reference = nearby(theta, scales, steps)
        costs = side_info.bytes_by_bits(scales, codes, reference)
        assert costs[side_info.INT8] == side_info.int8_bytes(N)
        for bits in side_info.BITS_ALLOWED:
            code, resolved, _ = round_trip(scales, codes, reference, bits)
            assert costs[bits] == side_info.wire_bytes(code, resolved.failed.numel())
    near = side_info.bytes_by_bits(scales, codes, nearby(theta, scales, 1.0))
    far = side_info.bytes_by_bits(scales, codes, nearby(theta, scales, 100.0))
    assert side_info.cheapest(near) in (3, 4) and side_info.cheapest(far) == side_info.INT8


def test_malformed_codes_and_repairs_are_refused():
    theta, scales, codes = sender_codes(n=4 * BLOCK_SIZE)
    with pytest.raises(CodecError, match="bits"):
        side_info.encode(scales, codes, 8)
    code = side_info.encode(scales, codes, 4)
    bad = [
        side_info.ModuloCode(4, code.numel, code.scales, code.residues[:-1], code.checks),
        side_info.ModuloCode(4, code.numel, code.scales[:-1], code.residues, code.checks),
        side_info.ModuloCode(4, code.numel, torch.full_like(code.scales, float("nan")), code.residues, code.checks),
        side_info.ModuloCode(4, code.numel, -code.scales, code.residues, code.checks),
        side_info.ModuloCode(9, code.numel, code.scales, code.residues, code.checks),
    ]
    for malformed in bad:
        with pytest.raises(CodecError):
            side_info.resolve(malformed, theta)
    with pytest.raises(CodecError, match="reference"):
        side_info.resolve(code, theta[:-1])
    far = theta + 1.0  # every block fails
    resolved = side_info.resolve(code, far)
    repair = side_info.repair_codes(codes, resolved.failed)
    with pytest.raises(CodecError, match="shape"):
        side_info.repaired(code, resolved, repair[:-1])
    tampered = repair.clone()
    tampered[0, 0] += 1
    with pytest.raises(CodecError, match="check"):
        side_info.repaired(code, resolved, tampered)
    tampered[0, 0] = -128
    with pytest.raises(CodecError, match="-128"):
        side_info.repaired(code, resolved, tampered)
    with pytest.raises(CodecError, match="block"):
        side_info.repair_codes(codes, torch.tensor([0, 0]))
    with pytest.raises(CodecError, match="block"):
        side_info.repair_codes(codes, torch.tensor([4]))
