"""Blockwise quantised codecs with stochastic rounding: int8-zstd and int4-zstd (pure).

A floating tensor is flattened and cut into blocks of BLOCK_SIZE elements (the last one
shorter). Each block gets one float32 scale s = absmax / max_code, rounded up to the next
float32 so that |x| / s never exceeds max_code, and each element the integer code

    q = floor(x / s + u),  u ~ U[0, 1)   (stochastic rounding: E[q · s] = x)

in [-max_code, max_code]; it decodes as q · s (in float32, then the spec's dtype), so
|x̂ − x| < s before that last rounding. Integer tensors travel unchanged.

Chunk of a floating tensor of n elements: the float32 scales of its ceil(n / BLOCK_SIZE)
blocks (little-endian), then the codes: int8 as one signed byte each (-128 is refused),
int4 as nibbles q + 8 in 1..15, two per byte, element 2i in the low nibble (nibble 0 is
refused; an odd count pads the last high nibble with 8, the code 0, and refuses any other
padding). A scale that is negative or not finite is refused. The encoder gives a block
holding a non-finite value a NaN scale, so that every receiver refuses it, as it refuses
non-finite values from any codec.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from noloco_rt.outer.codecs.base import Codec, CodecError, TensorSpec, byte_view, tensor_from_bytes

BLOCK_SIZE = 64
_SCALE_DTYPE = np.dtype("<f4")


def block_count(numel: int) -> int:
    return math.ceil(numel / BLOCK_SIZE)


def _scales_rounded_up(absmax: torch.Tensor, max_code: int) -> torch.Tensor:
    """absmax / max_code as float32, rounded toward +inf (blocks,) float64 -> float32."""
    exact = absmax / max_code
    scales = exact.float()
    inf = torch.tensor(math.inf, device=scales.device)
    return torch.where(scales.double() < exact, torch.nextafter(scales, inf), scales)


def quantize(flat: torch.Tensor, max_code: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(scales (blocks,) float32, codes (n,) int8) of a flat floating tensor (n,) n >= 1, on
    the tensor's device (`generator` on the same device): on a GPU the outer step quantises
    there and copies the codes, a quarter of the float32 bytes (DESIGN §4 "Devices")."""
    n = flat.numel()
    blocks = block_count(n)
    x = torch.zeros(blocks * BLOCK_SIZE, dtype=torch.float64, device=flat.device)
    x[:n] = flat
    x = x.view(blocks, BLOCK_SIZE)  # (blocks, B), the last block padded with zeros
    scales = _scales_rounded_up(x.abs().amax(dim=1), max_code)  # (blocks,); NaN or inf if a value is
    usable = torch.isfinite(scales)
    divisor = torch.where(usable & (scales > 0), scales.double(), 1.0)  # zero block: x / 1 = 0
    u = torch.rand(blocks, BLOCK_SIZE, generator=generator, dtype=torch.float64, device=flat.device)  # (blocks, B)
    # float64 holds x and s exactly and |x / s| <= max_code, so floor(x / s + u) stays in
    # range (the clamp only guards the int8 cast).
    codes = x.div_(divisor[:, None]).add_(u).floor_()  # in place: x is ours
    if not bool(usable.all()):
        codes[~usable] = 0.0
        scales = torch.where(usable, scales, math.nan)
    return scales, codes.clamp_(-max_code, max_code).reshape(-1)[:n].to(torch.int8)


@dataclass(frozen=True)
class QuantizedTensor:
    """A flat float32 tensor's `quantize` output: (blocks,) float32 scales, (n,) int8 codes."""

    scales: torch.Tensor
    codes: torch.Tensor

    def piece(self, start: int, count: int) -> QuantizedTensor:
        """Elements [start, start + count), `start` a multiple of BLOCK_SIZE: the blocks that
        quantising that piece alone would have (a view, no copy)."""
        if start % BLOCK_SIZE:
            raise ValueError(f"a quantised piece starts at a multiple of {BLOCK_SIZE}, not {start}")
        first = start // BLOCK_SIZE
        return QuantizedTensor(self.scales[first:first + block_count(count)], self.codes[start:start + count])


def dequantize(scales: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """codes (n,) int8 times the scale of their block (blocks,) float32 -> (n,) float32, on
    their device (one float32 product per element: the same bits on any device)."""
    per_element = scales.repeat_interleave(BLOCK_SIZE)[: codes.numel()]  # (n,)
    return codes.float() * per_element


class BlockQuantizedCodec(Codec):
    """Blockwise absmax scales and stochastically rounded codes in [-max_code, max_code]."""

    lossless = False
    stochastic = True
    max_code: ClassVar[int]

    @abstractmethod
    def code_bytes(self, numel: int) -> int:
        """Bytes of the codes of numel elements."""

    @abstractmethod
    def pack(self, codes: torch.Tensor) -> np.ndarray:
        """codes (n,) int8 in range -> their bytes (code_bytes(n),) uint8."""

    @abstractmethod
    def unpack(self, data: np.ndarray, numel: int) -> np.ndarray:
        """Bytes (code_bytes(numel),) -> codes (numel,) int8; CodecError for a code out of range."""

    def body_bytes(self, spec: TensorSpec) -> int:
        if not spec.torch_dtype.is_floating_point:
            return spec.numel * spec.torch_dtype.itemsize
        return _SCALE_DTYPE.itemsize * block_count(spec.numel) + self.code_bytes(spec.numel)

    def encode(self, tensor: torch.Tensor, generator: torch.Generator | None) -> np.ndarray:
        if not tensor.dtype.is_floating_point:
            return byte_view(tensor)
        if generator is None:
            raise CodecError(f"{self.name} rounds stochastically: it needs a generator")
        scales, codes = quantize(tensor.reshape(-1), self.max_code, generator)
        return self.encode_quantized(scales, codes)

    def encode_quantized(self, scales: torch.Tensor, codes: torch.Tensor) -> np.ndarray:
        """The chunk of codes quantised already (host tensors: `quantize`'s output, or a slice
        of it at block boundaries): scales, then the packed codes."""
        if scales.numel() != block_count(codes.numel()):
            raise CodecError(f"{self.name}: {scales.numel()} scales for {codes.numel()} codes, "
                             f"expected {block_count(codes.numel())}")
        return np.concatenate([scales.contiguous().numpy().astype(_SCALE_DTYPE).view(np.uint8),
                               self.pack(codes.contiguous())])

    def decode(self, chunk: np.ndarray, spec: TensorSpec) -> torch.Tensor:
        if not spec.torch_dtype.is_floating_point:
            return tensor_from_bytes(chunk.copy(), spec.torch_dtype, tuple(spec.shape))
        scale_bytes = _SCALE_DTYPE.itemsize * block_count(spec.numel)
        scales = chunk[:scale_bytes].copy().view(_SCALE_DTYPE).astype(np.float32)  # (blocks,)
        if not np.isfinite(scales).all() or (scales < 0).any():
            raise CodecError(f"{self.name}: a block scale is negative or not finite")
        codes = self.unpack(chunk[scale_bytes:], spec.numel)  # (n,) int8
        values = dequantize(torch.from_numpy(scales), torch.from_numpy(codes))
        return values.to(spec.torch_dtype).reshape(tuple(spec.shape))


class Int8ZstdCodec(BlockQuantizedCodec):
    """One signed byte per code in [-127, 127]."""

    name = "int8-zstd"
    max_code = 127

    def code_bytes(self, numel: int) -> int:
        return numel

    def pack(self, codes: torch.Tensor) -> np.ndarray:
        return codes.numpy().view(np.uint8)

    def unpack(self, data: np.ndarray, numel: int) -> np.ndarray:
        codes = data.view(np.int8)
        if (codes == -128).any():
            raise CodecError(f"{self.name}: code -128 is outside [-127, 127]")
        return codes.copy()


class Int4ZstdCodec(BlockQuantizedCodec):
    """Codes in [-7, 7] as nibbles q + 8, two per byte."""

    name = "int4-zstd"
    max_code = 7
    _PAD = 8  # the nibble of code 0

    def code_bytes(self, numel: int) -> int:
        return (numel + 1) // 2

    def pack(self, codes: torch.Tensor) -> np.ndarray:
        nibbles = (codes.to(torch.int16) + 8).to(torch.uint8).numpy()  # (n,) in 1..15
        if len(nibbles) % 2:
            nibbles = np.append(nibbles, np.uint8(self._PAD))
        pairs = nibbles.reshape(-1, 2)  # (ceil(n / 2), 2): element 2i low, 2i + 1 high
        return pairs[:, 0] | (pairs[:, 1] << 4)

    def unpack(self, data: np.ndarray, numel: int) -> np.ndarray:
        nibbles = np.stack([data & 0x0F, data >> 4], axis=1).reshape(-1)  # (2 * len(data),)
        if len(nibbles) > numel:
            if nibbles[numel] != self._PAD:
                raise CodecError(f"{self.name}: padding nibble {int(nibbles[numel])} is not {self._PAD} (code 0)")
            nibbles = nibbles[:numel]
        if (nibbles == 0).any():
            raise CodecError(f"{self.name}: nibble 0 (code -8) is outside [-7, 7]")
        return nibbles.astype(np.int8) - np.int8(8)


class Int2ZstdCodec(BlockQuantizedCodec):
    """Codes in [-1, 1] (three levels: −s, 0, s) as q + 1 in two bits, four per byte, element
    4i + j in bits 2j (2j + 1 upward); the code 3 is refused, and the padding after the last
    code is q = 0 (bits 01)."""

    name = "int2-zstd"
    max_code = 1
    _PAD = 1  # the 2-bit value of code 0

    def code_bytes(self, numel: int) -> int:
        return (numel + 3) // 4

    def pack(self, codes: torch.Tensor) -> np.ndarray:
        values = (codes.to(torch.int16) + 1).to(torch.uint8).numpy()  # (n,) in 0..2
        padded = np.full(self.code_bytes(len(values)) * 4, self._PAD, dtype=np.uint8)
        padded[: len(values)] = values
        groups = padded.reshape(-1, 4)  # (ceil(n / 4), 4)
        return groups[:, 0] | (groups[:, 1] << 2) | (groups[:, 2] << 4) | (groups[:, 3] << 6)

    def unpack(self, data: np.ndarray, numel: int) -> np.ndarray:
        values = np.stack([(data >> shift) & 0x03 for shift in (0, 2, 4, 6)], axis=1).reshape(-1)  # (4 · len,)
        if (values[numel:] != self._PAD).any():
            raise CodecError(f"{self.name}: padding after the last code is not code 0")
        values = values[:numel]
        if (values == 3).any():
            raise CodecError(f"{self.name}: 2-bit value 3 is outside codes [-1, 1]")
        return values.astype(np.int8) - np.int8(1)
