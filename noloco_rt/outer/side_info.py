"""A partner's θ coded against the receiver's own θ on int8's grid (side information), pure.

int8-zstd sends, per block of BLOCK_SIZE values, a float32 scale s and codes k in
[-127, 127] (noloco_rt.outer.codecs.quantized). A receiver holds its own θ_r, within the
replicas' spread of the sender's θ, so it needs only k's low `bits` bits: it takes the
integer ≡ k (mod 2^bits) nearest to θ_r / s. That is right while |k − θ_r / s| <
2^(bits − 1): for 99.9 % of values at 4 bits at the end of a simulated run's schedule,
where partners are about 2 steps apart; earlier they are about 11 apart, and more bits, or
int8 whole, cost less (benchmarks/README.md "A partner's θ as side information";
bytes_by_bits tells the receiver which). The sender cannot know where
it is wrong (it does not hold θ_r), so each block carries a 32-bit check of its codes;
the receiver names the blocks whose check fails (or whose codes leave [-127, 127]) and
the sender sends those blocks' int8 codes again (the repair). What the receiver ends
with is the sender's codes exactly: the same values, so the same convergence, as
int8-zstd, in fewer bytes when the partners are close and more when they are not (a
joiner, a replica far from the rest: its repair grows towards a whole int8 snapshot).

A check is Σ_i w_i·k_i mod 2^32 over the block, with odd weights w_i: a wrong code is off
by a multiple m·2^bits (|m| < 2^8), so one wrong code in a block always changes the check
(w_i is invertible mod 2^32); several cancel only by chance (about 2^-(32 − bits)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from noloco_rt.outer.codecs.base import CodecError
from noloco_rt.outer.codecs.quantized import BLOCK_SIZE, block_count, dequantize

MAX_CODE = 127
"""int8-zstd's codes, which this code carries: [-MAX_CODE, MAX_CODE]."""
BITS_ALLOWED = range(2, 8)
"""2..7 low bits per value (8 would be int8 itself)."""
SCALE_BYTES = 4
CHECK_BYTES = 4
REPAIR_INDEX_BYTES = 4
"""A repaired block's index (uint32) in the request and the reply."""
_MASK32 = (1 << 32) - 1


def _mixed(i: int) -> int:
    """splitmix64's finaliser of i: a fixed, well-mixed function of the position. Weights
    linear in the position would let errors cancel (+m at i and j, -m at i - d and j + d)."""
    z = (i + 0x9E3779B97F4A7C15) & ((1 << 64) - 1)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & ((1 << 64) - 1)
    return z ^ (z >> 31)


_WEIGHTS = torch.tensor([(_mixed(i) & _MASK32) | 1 for i in range(BLOCK_SIZE)], dtype=torch.int64)
"""Odd weights, a function of the position alone: sender and receiver agree on any machine
(no generator whose algorithm a torch release could change)."""


def in_blocks(values: torch.Tensor, dtype: torch.dtype, fill: float | bool = 0) -> torch.Tensor:
    """A copy of values (n,) >= 1 as (blocks, BLOCK_SIZE) of dtype, the last block padded with `fill`."""
    padded = torch.full((block_count(values.numel()) * BLOCK_SIZE,), fill, dtype=dtype)
    padded[: values.numel()] = values.reshape(-1).cpu()
    return padded.view(-1, BLOCK_SIZE)


def block_checks(codes: torch.Tensor) -> torch.Tensor:
    """(blocks,) int64 in [0, 2^32): the check of each block of codes (n,) int8 (n >= 1; the
    last block padded with code 0)."""
    # |w·k| < 2^39, 64 of them < 2^45: int64 holds the sum; & keeps its low 32 bits (two's complement).
    return (in_blocks(codes, torch.int64) * _WEIGHTS).sum(dim=1) & _MASK32


def pack_low_bits(codes: torch.Tensor, bits: int) -> np.ndarray:
    """The low `bits` bits of each code (n,) int8, packed little-endian: ceil(n·bits / 8) bytes."""
    low = (codes.cpu().numpy().astype(np.int16) & ((1 << bits) - 1)).astype(np.uint8)  # (n,) k mod 2^bits
    per_value = np.unpackbits(low[:, None], axis=1, bitorder="little")[:, :bits]  # (n, bits)
    return np.packbits(per_value.reshape(-1), bitorder="little")


def unpack_low_bits(data: np.ndarray, numel: int, bits: int) -> np.ndarray:
    """(numel,) int64 residues in [0, 2^bits) from pack_low_bits' bytes."""
    flat = np.unpackbits(data, bitorder="little")[: numel * bits].reshape(numel, bits)  # (n, bits)
    return (flat.astype(np.int64) << np.arange(bits, dtype=np.int64)).sum(axis=1)


def residue_bytes(numel: int, bits: int) -> int:
    return math.ceil(numel * bits / 8)


def code_bytes(numel: int, bits: int) -> int:
    """A modulo code of numel values at `bits`: scales, checks and residues."""
    return block_count(numel) * (SCALE_BYTES + CHECK_BYTES) + residue_bytes(numel, bits)


def repair_bytes(failed_blocks: int) -> int:
    """The request naming failed blocks and the repair (index and int8 codes per block)."""
    return failed_blocks * (2 * REPAIR_INDEX_BYTES + BLOCK_SIZE)


@dataclass(frozen=True)
class ModuloCode:
    """One flat tensor's int8 codes as sent against the receiver's θ."""

    bits: int
    numel: int
    scales: torch.Tensor
    """(blocks,) float32: int8-zstd's block scales, as they are."""
    residues: np.ndarray
    """(residue_bytes(numel, bits),) uint8: each code mod 2^bits, packed."""
    checks: torch.Tensor
    """(blocks,) int64 in [0, 2^32)."""

    @property
    def wire_bytes(self) -> int:
        return code_bytes(self.numel, self.bits)


def encode(scales: torch.Tensor, codes: torch.Tensor, bits: int) -> ModuloCode:
    """The modulo code of int8-zstd's quantisation of one flat tensor (`quantize`'s output:
    (blocks,) float32 scales, (n,) int8 codes in [-127, 127], host tensors)."""
    if bits not in BITS_ALLOWED:
        raise CodecError(f"side information: bits must be in 2..7, got {bits}")
    if codes.numel() < 1 or scales.numel() != block_count(codes.numel()):
        raise CodecError(f"side information: {scales.numel()} scales for {codes.numel()} codes")
    return ModuloCode(bits, codes.numel(), scales.float().contiguous(), pack_low_bits(codes, bits), block_checks(codes))


@dataclass(frozen=True)
class Resolved:
    """What a receiver made of a modulo code with its own θ."""

    codes: torch.Tensor
    """(n,) int8: the sender's codes, except in the failed blocks (code 0 there until repaired)."""
    failed: torch.Tensor
    """(f,) int64 ascending: the blocks to ask the sender for again."""


def steps_of(reference: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The receiver's θ (n,) in the sender's steps, its block scales (blocks,): (n,) float64;
    0 in a zero block (scale 0), whose codes are all 0."""
    per_value = scales.double().repeat_interleave(BLOCK_SIZE)[: reference.numel()]  # (n,)
    return torch.where(per_value > 0, reference.reshape(-1).double() / torch.where(per_value > 0, per_value, 1.0), 0.0)


def validate(code: ModuloCode) -> None:
    """CodecError unless the code's parts fit its size and its scales could be int8-zstd's."""
    if code.bits not in BITS_ALLOWED or code.numel < 1:
        raise CodecError(f"side information: bits {code.bits} or size {code.numel} out of range")
    blocks = block_count(code.numel)
    if code.scales.shape != (blocks,) or code.checks.shape != (blocks,):
        raise CodecError(f"side information: {tuple(code.scales.shape)} scales and {tuple(code.checks.shape)} "
                         f"checks for {blocks} blocks")
    if code.residues.shape != (residue_bytes(code.numel, code.bits),):
        raise CodecError(f"side information: {code.residues.shape[0]} residue bytes, expected "
                         f"{residue_bytes(code.numel, code.bits)}")
    if not bool(torch.isfinite(code.scales).all()) or bool((code.scales < 0).any()):
        raise CodecError("side information: a block scale is negative or not finite")
    if code.checks.dtype != torch.int64 or bool(((code.checks < 0) | (code.checks > _MASK32)).any()):
        raise CodecError("side information: a block check is not a 32-bit unsigned value")


def resolve(code: ModuloCode, reference: torch.Tensor) -> Resolved:
    """The sender's codes as far as the receiver's own θ (`reference`, flat, as many values,
    host) resolves them, and the blocks it could not."""
    validate(code)
    if reference.numel() != code.numel or not bool(torch.isfinite(reference).all()):
        raise CodecError(f"side information: the reference has {reference.numel()} values (or a non-finite "
                         f"one) for a code of {code.numel}")
    modulus = 1 << code.bits
    residues = torch.from_numpy(unpack_low_bits(code.residues, code.numel, code.bits))  # (n,) in [0, 2^bits)
    nearest = steps_of(reference, code.scales)  # (n,) θ_r in the sender's steps
    codes = residues + modulus * torch.round((nearest - residues) / modulus).long()  # (n,) ≡ residues, nearest θ_r
    in_range = codes.abs() <= MAX_CODE
    codes = torch.where(in_range, codes, 0).to(torch.int8)
    wrong = (block_checks(codes) != code.checks) | ~in_blocks(in_range, torch.bool, True).all(dim=1)
    failed = wrong.nonzero().reshape(-1)  # (f,) ascending
    blocks = in_blocks(codes, torch.int8)
    blocks[failed] = 0
    return Resolved(blocks.reshape(-1)[: code.numel].clone(), failed)


def repair_codes(codes: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """Sender side: (len(blocks), BLOCK_SIZE) int8, the int8 codes of the named blocks of
    codes (n,) (the last block padded with code 0). CodecError for a block out of range or
    named twice."""
    count = block_count(codes.numel())
    if blocks.numel() and (int(blocks.min()) < 0 or int(blocks.max()) >= count
                           or torch.unique(blocks).numel() != blocks.numel()):
        raise CodecError(f"side information: a repair names a block outside 0..{count - 1} or one twice")
    return in_blocks(codes, torch.int8)[blocks.long()]


def repaired(code: ModuloCode, resolved: Resolved, repair: torch.Tensor) -> torch.Tensor:
    """The sender's values (n,) float32, as int8-zstd decodes them, from what the receiver
    resolved and the sender's repair of the failed blocks ((f, BLOCK_SIZE) int8). CodecError
    when the repair does not fit, holds code -128, or fails its check."""
    failed = resolved.failed
    if tuple(repair.shape) != (failed.numel(), BLOCK_SIZE) or repair.dtype != torch.int8:
        raise CodecError(f"side information: a repair of shape {tuple(repair.shape)} for {failed.numel()} blocks")
    if bool((repair == -128).any()):
        raise CodecError("side information: repair code -128 is outside [-127, 127]")
    blocks = in_blocks(resolved.codes, torch.int8)
    blocks[failed] = repair
    padded = blocks.reshape(-1)
    codes = padded[: code.numel]
    if failed.numel() and bool((block_checks(codes)[failed] != code.checks[failed]).any()):
        raise CodecError("side information: a repaired block fails its check")
    if bool((padded[code.numel:] != 0).any()):
        raise CodecError("side information: a repair's padding after the last code is not code 0")
    return dequantize(code.scales, codes)


def wire_bytes(code: ModuloCode, failed_blocks: int) -> int:
    """Bytes both ways for one receiver: the code, the request naming the failed blocks,
    and the repair (index and int8 codes per block)."""
    return code.wire_bytes + repair_bytes(failed_blocks)


INT8 = 8
"""The hint for "send int8-zstd's codes whole": partners too far apart for any modulo code."""


def int8_bytes(numel: int) -> int:
    """int8-zstd's chunk of one flat tensor before zstd (which saves about 2 % of it)."""
    return block_count(numel) * SCALE_BYTES + numel


def bytes_by_bits(scales: torch.Tensor, codes: torch.Tensor, reference: torch.Tensor) -> dict[int, int]:
    """Receiver side, once it holds the sender's codes: what each number of bits (and INT8)
    would have cost against this reference, both ways. A code of b bits resolves a value
    wrong exactly where |k − θ_r / s| ≥ 2^(b − 1) (ties included: rounding may go either way)."""
    distance = (codes.double() - steps_of(reference, scales)).abs()  # (n,)
    worst = in_blocks(distance, torch.float64).amax(dim=1)  # (blocks,) the farthest value of each block
    costs = {INT8: int8_bytes(codes.numel())}
    for bits in BITS_ALLOWED:
        failed = int((worst >= (1 << (bits - 1))).sum())
        costs[bits] = code_bytes(codes.numel(), bits) + repair_bytes(failed)
    return costs


def cheapest(costs: dict[int, int]) -> int:
    """The bits (or INT8) of the smallest cost; fewer bits on a tie."""
    return min(costs, key=lambda bits: (costs[bits], bits))
