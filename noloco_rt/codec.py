"""Snapshot compression (pure, no I/O): byte-plane shuffle, zstd, optional bf16.

zstd alone barely shrinks float32 weights (the low mantissa bytes look random);
grouping byte k of every element together (shuffle) exposes the repetitive sign and
exponent bytes to zstd. bf16 halves the bytes first (lossy). Decompression is bounded:
a payload that would expand past its declared size is refused without allocating it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch
import zstandard

CODECS = ("raw", "zstd", "shuffle-zstd", "bf16-shuffle-zstd")
ALLOWED_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
    "int64": torch.int64, "int32": torch.int32, "uint8": torch.uint8,
}


class CodecError(ValueError):
    """A payload cannot be decoded: the message says why."""


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: str
    """Dtype of the decoded tensor (the original one)."""

    @property
    def numel(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count


@dataclass(frozen=True)
class EncodedTensors:
    codec: str
    specs: list[TensorSpec]
    payload: bytes
    raw_bytes: int
    """Size of the tensors as they are (float32 for weights)."""
    wire_bytes: int

    @property
    def ratio(self) -> float:
        return self.raw_bytes / self.wire_bytes if self.wire_bytes else float("inf")


def shuffle_bytes(data: bytes | memoryview, itemsize: int) -> bytes:
    """Byte k of every element becomes contiguous: (n, itemsize) -> (itemsize, n)."""
    array = np.frombuffer(data, dtype=np.uint8)
    if itemsize <= 1:
        return array.tobytes()
    if len(array) % itemsize:
        raise CodecError(f"{len(array)} bytes is not a whole number of {itemsize}-byte elements")
    return array.reshape(-1, itemsize).T.tobytes()


def unshuffle_bytes(data: bytes | memoryview, itemsize: int) -> bytes:
    array = np.frombuffer(data, dtype=np.uint8)
    if itemsize <= 1:
        return array.tobytes()
    if len(array) % itemsize:
        raise CodecError(f"{len(array)} bytes is not a whole number of {itemsize}-byte elements")
    return array.reshape(itemsize, -1).T.tobytes()


def _wire_dtype(codec: str, dtype: torch.dtype) -> torch.dtype:
    return torch.bfloat16 if codec == "bf16-shuffle-zstd" and dtype.is_floating_point else dtype


def encode_tensors(tensors: list[torch.Tensor], codec: str, level: int = 3) -> EncodedTensors:
    """One payload for all tensors (zstd sees one stream, so small tensors compress too)."""
    if codec not in CODECS:
        raise CodecError(f"unknown codec {codec!r}; known: {', '.join(CODECS)}")
    specs, chunks, raw_bytes = [], [], 0
    for tensor in tensors:
        name = str(tensor.dtype).removeprefix("torch.")
        if name not in ALLOWED_DTYPES:
            raise CodecError(f"dtype {name} is not allowed")
        tensor = tensor.detach().contiguous().cpu()
        specs.append(TensorSpec(tuple(tensor.shape), name))
        raw_bytes += tensor.numel() * tensor.element_size()
        wire = tensor.to(_wire_dtype(codec, tensor.dtype))
        chunks.append(wire.reshape(-1).view(torch.uint8).numpy().tobytes() if wire.numel() else b"")
    body = b"".join(chunks)
    if codec == "raw":
        payload = body
    else:
        if codec != "zstd":
            # Shuffle per tensor so planes never straddle element sizes.
            offset, shuffled = 0, []
            for spec in specs:
                size = _wire_dtype(codec, ALLOWED_DTYPES[spec.dtype]).itemsize
                length = spec.numel * size
                shuffled.append(shuffle_bytes(memoryview(body)[offset:offset + length], size))
                offset += length
            body = b"".join(shuffled)
        payload = zstandard.ZstdCompressor(level=level).compress(body)
    return EncodedTensors(codec=codec, specs=specs, payload=payload, raw_bytes=raw_bytes, wire_bytes=len(payload))


def decode_tensors(encoded: EncodedTensors, *, max_decompressed_bytes: int) -> list[torch.Tensor]:
    """The tensors back (bf16 codec: as their original dtype, values rounded through bf16).

    Raises CodecError on an unknown codec or dtype, a size that disagrees with the specs,
    a size over max_decompressed_bytes, or a damaged payload.
    """
    if encoded.codec not in CODECS:
        raise CodecError(f"unknown codec {encoded.codec!r}")
    sizes = []
    for spec in encoded.specs:
        if spec.dtype not in ALLOWED_DTYPES:
            raise CodecError(f"dtype {spec.dtype!r} is not allowed")
        if any(d < 0 for d in spec.shape):
            raise CodecError(f"negative dimension in {spec.shape}")
        sizes.append(spec.numel * _wire_dtype(encoded.codec, ALLOWED_DTYPES[spec.dtype]).itemsize)
    expected = sum(sizes)
    if expected > max_decompressed_bytes:
        raise CodecError(f"declared {expected} bytes exceed the bound of {max_decompressed_bytes}")
    if encoded.codec == "raw":
        body = encoded.payload
    else:
        try:
            declared = zstandard.frame_content_size(encoded.payload)
            if declared > expected:  # -1 when the frame does not say
                raise CodecError(f"zstd frame declares {declared} bytes, specs only {expected}")
            # A bounded streaming read: at most expected + 1 bytes are ever produced, whatever
            # the frame claims (one-shot decompress() trusts the frame header's size).
            with zstandard.ZstdDecompressor().stream_reader(encoded.payload) as reader:
                body = reader.read(expected + 1)
        except zstandard.ZstdError as exc:
            raise CodecError(f"zstd payload cannot be decompressed within {expected} bytes: {exc}") from None
    if len(body) != expected:
        raise CodecError(f"payload holds {len(body)} bytes, specs declare {expected}")
    tensors, offset = [], 0
    for spec, size in zip(encoded.specs, sizes, strict=True):
        chunk = memoryview(body)[offset:offset + size]
        offset += size
        wire_dtype = _wire_dtype(encoded.codec, ALLOWED_DTYPES[spec.dtype])
        if encoded.codec in ("shuffle-zstd", "bf16-shuffle-zstd"):
            chunk = memoryview(unshuffle_bytes(chunk, wire_dtype.itemsize))
        raw = torch.frombuffer(bytearray(chunk), dtype=torch.uint8) if size else torch.empty(0, dtype=torch.uint8)
        tensor = raw.view(wire_dtype).reshape(spec.shape)
        tensors.append(tensor.to(ALLOWED_DTYPES[spec.dtype]))
    return tensors


def checksum(payload: bytes | memoryview) -> str:
    return hashlib.blake2b(payload, digest_size=16).hexdigest()
