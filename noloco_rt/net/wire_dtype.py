"""How activations and gradients travel between pipeline stages (`pipeline.wire_dtype`), pure.

Over a slow link the data path, not the outer exchange, carries most bytes: a 125m
microbatch's activations are 25 MB per hop in float32. A sender packs a float32 tensor
into the wire dtype; the receiver checks what arrived and unpacks it back to float32, so
the stage's compute never sees the wire form.

- float32: as computed (exact).
- bfloat16 / float16: a cast (relative error at most 2^-8 / 2^-11 per element; float16
  saturates at ±65504 instead of overflowing to inf, and flushes magnitudes below 2^-24).
- int8: activations as int8 codes with one float32 scale per token (the last dimension's
  largest magnitude / 127, as SWARM compresses its activations): absolute error at most
  scale / 2 per element. Gradients travel in bfloat16 unless pipeline.gradient_wire_dtype
  says int8 (packed the same way; priced in benchmarks/README.md).
- int4: the same with 7 levels a side, two codes a byte (uint8: the even element in the low
  half): an eighth of float32's bytes plus the scales; a tensor whose last dimension is odd
  travels as int8. Gradients travel in bfloat16.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from noloco_rt.config.choices import WIRE_DTYPES

_CASTS = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_FLOATS = frozenset(_CASTS.values())
INT8_LEVELS = 127
INT4_LEVELS = 7


class WireDtypeError(ValueError):
    """Received tensors that are not a valid packing of one tensor."""


def gradient_wire_dtype(wire_dtype: str, chosen: str = "auto") -> str:
    """The dtype gradients travel in when activations travel in `wire_dtype` and
    pipeline.gradient_wire_dtype is `chosen` (auto: bfloat16 under int8 and int4, else the
    activations'; int4 gradients are not offered)."""
    if chosen != "auto":
        return chosen
    return "bfloat16" if wire_dtype in ("int8", "int4") else wire_dtype


def pack(tensor: torch.Tensor, wire_dtype: str) -> list[torch.Tensor]:
    """The frames of one float tensor in the wire dtype (on the tensor's device: cast before
    the host copy, so fewer bytes cross PCIe too)."""
    tensor = tensor.detach()
    if wire_dtype == "float16":  # saturate: one outlier must not turn a whole microbatch into inf
        limit = torch.finfo(torch.float16).max
        return [tensor.clamp(-limit, limit).to(torch.float16).contiguous()]
    if wire_dtype in _CASTS:
        return [tensor.to(_CASTS[wire_dtype]).contiguous()]
    if wire_dtype not in ("int8", "int4"):
        raise ValueError(f"unknown wire dtype {wire_dtype!r}; one of {', '.join(WIRE_DTYPES)}")
    nibbles = wire_dtype == "int4" and tensor.dim() > 0 and tensor.shape[-1] % 2 == 0
    levels = INT4_LEVELS if nibbles else INT8_LEVELS
    values = tensor.float()
    scale = values.abs().amax(dim=-1, keepdim=True).div_(levels)
    codes = values.div(scale.clamp_min(torch.finfo(torch.float32).tiny)).round_().clamp_(-levels, levels)
    if not nibbles:
        return [codes.to(torch.int8).contiguous(), scale.contiguous()]
    offset = codes.to(torch.int16).add_(INT4_LEVELS + 1)  # 1..15: a nibble each
    pairs = offset[..., 0::2] | (offset[..., 1::2] << 4)
    return [pairs.to(torch.uint8).contiguous(), scale.contiguous()]


def frames_of(dtypes: Sequence[torch.dtype]) -> int:
    """How many received tensors the first packed tensor takes (1, or 2 for int8 + scale);
    raises WireDtypeError for a dtype that starts no packing."""
    if not dtypes:
        raise WireDtypeError("no tensors")
    if dtypes[0] in _FLOATS:
        return 1
    if dtypes[0] in (torch.int8, torch.uint8) and len(dtypes) >= 2 and dtypes[1] == torch.float32:
        return 2
    raise WireDtypeError(f"tensors of {[str(d) for d in dtypes]} are not a wire packing")


def unpack(frames: Sequence[torch.Tensor]) -> torch.Tensor:
    """float32 back from one packing (one float tensor, or int8 codes, or int4 codes two a
    byte, and their per-token scales, whose shape must be the codes' with a last dimension
    of 1)."""
    if len(frames) == 1 and frames[0].dtype in _FLOATS:
        return frames[0].float()
    if len(frames) != 2 or frames[0].dtype not in (torch.int8, torch.uint8) or frames[1].dtype != torch.float32:
        raise WireDtypeError("not a wire packing")
    codes, scale = frames
    if codes.dim() == 0 or tuple(scale.shape) != (*codes.shape[:-1], 1):
        raise WireDtypeError(f"scales {tuple(scale.shape)} do not fit codes {tuple(codes.shape)}")
    if codes.dtype == torch.int8:
        return codes.float().mul_(scale)
    # Nibbles outside 1..15 decode past the levels: the clamp keeps a hostile byte within scale * 7.
    low, high = (codes & 0xF).to(torch.int16), (codes >> 4).to(torch.int16)
    values = torch.stack((low, high), dim=-1).flatten(-2).sub_(INT4_LEVELS + 1).clamp_(-INT4_LEVELS, INT4_LEVELS)
    return values.float().mul_(scale)
