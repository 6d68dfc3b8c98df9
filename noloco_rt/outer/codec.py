"""Snapshot compression (pure, no I/O): encode a list of tensors into one payload and back.

The codec families live in noloco_rt.outer.codecs (one class each, one interface): lossless
(raw, zstd, shuffle-zstd), bf16 (bf16-shuffle-zstd) and blockwise quantised (int8-zstd,
int4-zstd, stochastic rounding). This module joins the per-tensor chunks: all tensors of
a snapshot go into one zstd frame (raw: the bytes as they are), so small tensors compress
too.

Decompression is bounded: every family states the exact size of a tensor's chunk from its
spec, so the receiver's specs fix the exact output size; a frame that declares another
size is refused before anything is allocated, and one that does not declare it is decoded
into a buffer of exactly that size and refused if it overflows.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence

import numpy as np
import torch

from noloco_rt.config.choices import CODECS
from noloco_rt.outer.codecs import codec_named, is_lossless
from noloco_rt.outer.codecs.base import (
    ALLOWED_DTYPES,
    CodecError,
    EncodedTensors,
    TensorSpec,
    planes,
)
from noloco_rt.outer.codecs.frame import compress_frame, decompress_exactly
from noloco_rt.outer.codecs.quantized import BlockQuantizedCodec, QuantizedTensor
from noloco_rt.outer.device_check import one_device

__all__ = ["ALLOWED_DTYPES", "CODECS", "CodecError", "EncodedTensors", "TensorSpec", "checksum",
           "decode_tensors", "encode_quantized_tensors", "encode_tensors", "fresh_generator", "is_lossless",
           "shuffle_bytes", "unshuffle_bytes"]


def shuffle_bytes(data: bytes | memoryview, itemsize: int) -> bytes:
    """Byte k of every element becomes contiguous: (n, itemsize) -> (itemsize, n).

    Raises CodecError if len(data) is not a multiple of itemsize."""
    return planes(data, itemsize, shuffled=True).tobytes()


def unshuffle_bytes(data: bytes | memoryview, itemsize: int) -> bytes:
    """Exact inverse of shuffle_bytes for the same itemsize."""
    return planes(data, itemsize, shuffled=False).tobytes()


def fresh_generator() -> torch.Generator:
    """A torch.Generator seeded from os.urandom (the default for stochastic rounding)."""
    return torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)


def encode_tensors(tensors: Sequence[torch.Tensor], codec: str, level: int = 3, *,
                   generator: torch.Generator | None = None) -> EncodedTensors:
    """Compress tensors (any layout, all on one device: ValueError naming two otherwise)
    into one payload.

    `generator` drives the stochastic rounding of the quantised codecs (None: a fresh one
    from os.urandom); the others ignore it. Raises CodecError for an unknown codec, a dtype
    outside ALLOWED_DTYPES or a bad level.
    """
    one_device(tensors, what="encode_tensors")
    family = codec_named(codec)
    if family.stochastic and generator is None:
        generator = fresh_generator()
    specs: list[TensorSpec] = []
    chunks: list[np.ndarray] = []
    raw_bytes = 0
    for tensor in tensors:
        name = str(tensor.dtype).removeprefix("torch.")
        if name not in ALLOWED_DTYPES:
            raise CodecError(f"dtype {name} is not allowed; allowed: {', '.join(ALLOWED_DTYPES)}")
        tensor = tensor.detach().cpu().contiguous()
        spec = TensorSpec(tuple(tensor.shape), name)
        specs.append(spec)
        raw_bytes += tensor.numel() * tensor.element_size()
        if tensor.numel() == 0:
            continue  # nothing to send; viewing an empty tensor as bytes is not allowed
        chunk = family.encode(tensor, generator)
        if chunk.nbytes != family.body_bytes(spec):  # a codec bug would otherwise surface at the receiver
            raise CodecError(f"{codec} encoded {chunk.nbytes} bytes for {spec}, it states {family.body_bytes(spec)}")
        chunks.append(chunk)
    payload = compress_frame(chunks, level) if family.framed else b"".join(chunks)
    return EncodedTensors(codec=codec, specs=specs, payload=payload, raw_bytes=raw_bytes,
                          wire_bytes=len(payload))


def encode_quantized_tensors(tensors: Sequence[QuantizedTensor], codec: str, level: int = 3) -> EncodedTensors:
    """Pack flat float32 tensors quantised already (host tensors, by `quantize` on the
    replica's device) into the payload `encode_tensors` gives for a blockwise codec: the same
    specs (1-D float32) and layout, so receivers cannot tell the two apart. CodecError for a
    codec that is not blockwise quantised."""
    family = codec_named(codec)
    if not isinstance(family, BlockQuantizedCodec):
        raise CodecError(f"{codec} is not a blockwise quantised codec")
    specs = [TensorSpec((t.codes.numel(),), "float32") for t in tensors]
    chunks = [family.encode_quantized(t.scales, t.codes) for t in tensors if t.codes.numel()]
    payload = compress_frame(chunks, level)
    return EncodedTensors(codec=codec, specs=specs, payload=payload, raw_bytes=4 * sum(s.numel for s in specs),
                          wire_bytes=len(payload))


def decode_tensors(encoded: EncodedTensors, max_decompressed_bytes: int) -> list[torch.Tensor]:
    """The tensors back, each writable and owning its memory, in the dtype of its spec
    (lossy codecs: floats come back in their original dtype, values as the codec rounded them).

    Raises CodecError on an unknown codec, a spec with a bad dtype or shape, specs whose
    total exceeds max_decompressed_bytes, a payload that is damaged, truncated, has
    trailing bytes or holds a different number of bytes than the specs declare, or a body
    the codec's encoding cannot hold (a bad scale or code). Nothing larger than the specs'
    total is ever allocated.
    """
    family = codec_named(encoded.codec)
    sizes: list[int] = []
    for spec in encoded.specs:
        spec.validate()
        sizes.append(family.body_bytes(spec))
    expected = sum(sizes)
    if expected > max_decompressed_bytes:
        raise CodecError(f"specs declare {expected} bytes, over the bound of {max_decompressed_bytes}")
    if family.framed:
        body = decompress_exactly(encoded.payload, expected)
    elif len(encoded.payload) != expected:
        raise CodecError(f"payload holds {len(encoded.payload)} bytes, specs declare {expected}")
    else:
        body = encoded.payload
    flat = np.frombuffer(body, dtype=np.uint8)  # (expected,), read-only view of body
    tensors, offset = [], 0
    for spec, size in zip(encoded.specs, sizes, strict=True):
        if size == 0:
            tensors.append(torch.empty(tuple(spec.shape), dtype=spec.torch_dtype))
            continue
        tensors.append(family.decode(flat[offset:offset + size], spec))
        offset += size
    return tensors


def checksum(payload: bytes | memoryview) -> str:
    """blake2b digest (16 bytes) of payload as 32 hex characters."""
    return hashlib.blake2b(payload, digest_size=16).hexdigest()
