"""Sparse low-bit codecs for outer gradients: topk2-zstd and topk4-zstd (pure).

Meant for Δ = θ − φ, which is small and whose largest entries carry most of it (the
snapshot of θ itself is never sparse). A floating tensor is flattened and cut into
chunks of CHUNK elements (the last one shorter). Each chunk keeps its
`keep(length)` entries of largest magnitude (KEEP of a full chunk: 1/64, about 1.6 %) and
quantises them to `bits` bits against the chunk's scale s = their absmax:

    code q in [0, 2^bits − 1] ;  value = s · t_q,  t_q = (2q − L) / L in float32,  L = 2^bits − 1

with round-to-nearest: deterministic, so a sender knows exactly what its partners decode
(the error feedback of noloco_rt.outer.delta_exchange keeps what was not sent), and a
decoded tensor encodes to itself (its largest entry is ±s exactly). The others decode as 0.
Integer tensors travel unchanged.

The selection and the rounding are plain torch (`sparse_round_trip`): they run on the
device the tensor is on, and only the kept entries need to leave it.

Chunk of a floating tensor of n elements, in order: the float32 scales of its chunks
(little-endian), the local indices of the kept entries (chunk by chunk, strictly
increasing within a chunk) as uint16 with their high bytes first and then their low bytes
(zstd finds the slowly rising high bytes), then the codes packed `8 / bits` to a byte,
element i of the whole tensor's kept list in the bits (i mod per_byte) · bits upward; the
last byte pads with code 0 bits. A receiver refuses a scale that is negative or not
finite, an index out of its chunk, indices that do not strictly rise (a duplicate), and
padding bits that are not zero.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
import torch

from noloco_rt.outer.codecs.base import Codec, CodecError, TensorSpec, byte_view, tensor_from_bytes

CHUNK = 4096
KEEP = 64
_SCALE_DTYPE = np.dtype("<f4")


def keep(length: int) -> int:
    """Entries kept of a chunk of `length` >= 1 elements: KEEP of a full one, as many per
    element (rounded up, at least one) of a shorter one."""
    return min(length, max(1, math.ceil(KEEP * length / CHUNK)))


def chunk_lengths(numel: int) -> list[int]:
    full, rest = divmod(numel, CHUNK)
    return [CHUNK] * full + ([rest] if rest else [])


def kept_count(numel: int) -> int:
    """Entries kept of a tensor of numel elements (exact, from its size alone)."""
    full, rest = divmod(numel, CHUNK)
    return full * KEEP + (keep(rest) if rest else 0)


def _select(flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(chunk of each kept entry (m,) int64, local index (m,) int64, value (m,)) of a flat
    floating tensor (n,), chunk by chunk, indices rising within a chunk."""
    n = flat.numel()
    full = n // CHUNK
    pieces = []
    if full:
        rows = flat[: full * CHUNK].view(full, CHUNK)  # (full, CHUNK)
        local = rows.abs().topk(KEEP, dim=1).indices.sort(dim=1).values  # (full, KEEP)
        chunk = torch.arange(full, device=flat.device)[:, None].expand(full, KEEP)
        pieces.append((chunk.reshape(-1), local.reshape(-1), rows.gather(1, local).reshape(-1)))
    if n > full * CHUNK:
        tail = flat[full * CHUNK:]  # (rest,)
        local = tail.abs().topk(keep(tail.numel())).indices.sort().values  # (k,)
        pieces.append((torch.full_like(local, full), local, tail[local]))
    chunks, locals_, values = (torch.cat(p) for p in zip(*pieces, strict=True))
    return chunks, locals_, values


def _scales(values: torch.Tensor, chunks: torch.Tensor, count: int) -> torch.Tensor:
    """absmax of the kept values of each chunk (count,) float32; NaN where one is not finite."""
    absval = values.abs().float()
    scales = torch.zeros(count, dtype=torch.float32, device=values.device)
    scales.scatter_reduce_(0, chunks, absval, reduce="amax")
    bad = torch.zeros(count, dtype=torch.bool, device=values.device)
    bad.scatter_reduce_(0, chunks, ~torch.isfinite(absval), reduce="amax")
    return torch.where(bad, torch.full_like(scales, math.nan), scales)


def _codes(values: torch.Tensor, scale_per_entry: torch.Tensor, levels: int) -> torch.Tensor:
    """Nearest code in [0, levels] of each kept value (m,) int64 (0 scale: the middle-low code)."""
    unit = torch.where(scale_per_entry > 0, values.float() / scale_per_entry, torch.zeros_like(scale_per_entry))
    codes = torch.round((unit.clamp(-1.0, 1.0) + 1.0) * levels / 2.0)
    return torch.nan_to_num(codes, nan=0.0).long()


def level_table(levels: int) -> np.ndarray:
    """(2q − L) / L for q in [0, L] as float32: a value decodes as its scale times one of these,
    so the largest (±1) comes back exactly and a decoded tensor encodes to itself."""
    return ((2.0 * np.arange(levels + 1) - levels) / levels).astype(np.float32)


def _dequantize(codes: torch.Tensor, scale_per_entry: torch.Tensor, levels: int) -> torch.Tensor:
    table = torch.from_numpy(level_table(levels)).to(scale_per_entry.device)
    return scale_per_entry * table[codes]


def sparse_round_trip(flat: torch.Tensor, bits: int) -> torch.Tensor:
    """What a partner decodes of flat (n,) under the top-k codec of `bits`, computed where
    flat is (no bytes): a dense tensor of flat's dtype with the kept entries rounded."""
    if flat.numel() == 0:
        return flat.clone()
    chunks, local, values = _select(flat)
    scales = _scales(values, chunks, len(chunk_lengths(flat.numel())))
    per_entry = scales[chunks]
    decoded = _dequantize(_codes(values, per_entry, (1 << bits) - 1), per_entry, (1 << bits) - 1)
    out = torch.zeros_like(flat)
    out[chunks * CHUNK + local] = decoded.to(flat.dtype)
    return out


class TopKCodec(Codec):
    """The KEEP largest of every CHUNK entries, `bits` bits each, with a scale per chunk."""

    lossless = False
    bits: ClassVar[int]

    @property
    def per_byte(self) -> int:
        return 8 // self.bits

    def body_bytes(self, spec: TensorSpec) -> int:
        if not spec.torch_dtype.is_floating_point:
            return spec.numel * spec.torch_dtype.itemsize
        if spec.numel == 0:
            return 0
        kept = kept_count(spec.numel)
        return _SCALE_DTYPE.itemsize * len(chunk_lengths(spec.numel)) + 2 * kept + math.ceil(kept / self.per_byte)

    def encode(self, tensor: torch.Tensor, generator: torch.Generator | None) -> np.ndarray:
        if not tensor.dtype.is_floating_point:
            return byte_view(tensor)
        flat = tensor.reshape(-1)
        chunks, local, values = _select(flat)
        scales = _scales(values, chunks, len(chunk_lengths(flat.numel())))
        codes = _codes(values, scales[chunks], (1 << self.bits) - 1)
        index = local.to(torch.int32).cpu().numpy().astype("<u2")  # (m,) < CHUNK
        planes = index.view(np.uint8).reshape(-1, 2).T[::-1]  # (2, m): high bytes, then low bytes
        return np.concatenate([scales.cpu().numpy().astype(_SCALE_DTYPE).view(np.uint8),
                               planes.reshape(-1), self._pack(codes.cpu().numpy())])

    def decode(self, chunk: np.ndarray, spec: TensorSpec) -> torch.Tensor:
        if not spec.torch_dtype.is_floating_point:
            return tensor_from_bytes(chunk.copy(), spec.torch_dtype, tuple(spec.shape))
        lengths = chunk_lengths(spec.numel)
        kept = kept_count(spec.numel)
        scale_end = _SCALE_DTYPE.itemsize * len(lengths)
        scales = chunk[:scale_end].copy().view(_SCALE_DTYPE).astype(np.float32)  # (chunks,)
        if not np.isfinite(scales).all() or (scales < 0).any():
            raise CodecError(f"{self.name}: a chunk scale is negative or not finite")
        high, low = chunk[scale_end:scale_end + kept], chunk[scale_end + kept:scale_end + 2 * kept]
        local = (high.astype(np.int64) << 8) | low  # (kept,)
        per_chunk = np.array([keep(length) for length in lengths])  # (chunks,)
        owner = np.repeat(np.arange(len(lengths)), per_chunk)  # (kept,) chunk of each entry
        if (local >= np.asarray(lengths)[owner]).any():
            raise CodecError(f"{self.name}: an index lies outside its chunk")
        rising = np.diff(local) > 0
        starts = np.cumsum(per_chunk)[:-1]  # where a new chunk's indices begin
        rising[starts - 1] = True  # a chunk's first index need not exceed the previous chunk's last
        if not rising.all():
            raise CodecError(f"{self.name}: indices of a chunk repeat or do not rise")
        codes = self._unpack(chunk[scale_end + 2 * kept:], kept)  # (kept,)
        levels = (1 << self.bits) - 1
        values = scales[owner] * level_table(levels)[codes]
        out = np.zeros(spec.numel, dtype=np.float32)
        out[owner * CHUNK + local] = values
        return torch.from_numpy(out).to(spec.torch_dtype).reshape(tuple(spec.shape))

    def _pack(self, codes: np.ndarray) -> np.ndarray:
        """codes (m,) in [0, 2^bits) -> (ceil(m / per_byte),) uint8, padded with zero bits."""
        padded = np.zeros(math.ceil(len(codes) / self.per_byte) * self.per_byte, dtype=np.uint8)
        padded[: len(codes)] = codes
        groups = padded.reshape(-1, self.per_byte).astype(np.uint16)
        shifts = np.arange(self.per_byte, dtype=np.uint16) * self.bits
        return (groups << shifts).sum(axis=1).astype(np.uint8)

    def _unpack(self, data: np.ndarray, count: int) -> np.ndarray:
        shifts = np.arange(self.per_byte, dtype=np.uint8) * self.bits
        codes = ((data[:, None] >> shifts) & ((1 << self.bits) - 1)).reshape(-1)  # (len(data) * per_byte,)
        if codes[count:].any():
            raise CodecError(f"{self.name}: padding bits after the last code are not zero")
        return codes[:count]


class TopK2Codec(TopKCodec):
    name = "topk2-zstd"
    bits = 2


class TopK4Codec(TopKCodec):
    name = "topk4-zstd"
    bits = 4
