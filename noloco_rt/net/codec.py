"""Snapshot compression (pure, no I/O): byte-plane shuffle, zstd, optional bf16.

zstd alone barely shrinks float32 weights (the low mantissa bytes look random);
grouping byte k of every element together (shuffle) exposes the repetitive sign and
exponent bytes to zstd. bf16 halves the bytes first (lossy). All tensors of a snapshot
go into one zstd frame, so small tensors compress too.

Decompression is bounded: the receiver's specs fix the exact output size, a frame that
declares another size is refused before anything is allocated, and one that does not
declare it is decoded into a buffer of exactly that size and refused if it overflows.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import zstandard

from noloco_rt.net.codec_names import CODECS

ALLOWED_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int64": torch.int64,
    "int32": torch.int32,
    "uint8": torch.uint8,
}
_SHUFFLED = ("shuffle-zstd", "bf16-shuffle-zstd")
# zstd's own decoder limit is a 128 MiB window. A frame that does not declare its content
# size may still claim that window and make the decoder allocate it for a tiny output, so
# the window is capped near the output size; 1 MiB of slack costs nothing and keeps
# honest frames well inside the cap.
_MIN_WINDOW_BYTES = 1 << 20
_ZSTD_DEFAULT_MAX_WINDOW_BYTES = 1 << 27


class CodecError(ValueError):
    """A payload cannot be encoded or decoded: the message says why."""


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype name of one tensor as the caller gave it (before any bf16 cast)."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def validate(self) -> None:
        """Raise CodecError unless the dtype is allowed and every dimension is an int >= 0."""
        if not isinstance(self.dtype, str) or self.dtype not in ALLOWED_DTYPES:
            raise CodecError(f"dtype {self.dtype!r} is not allowed; allowed: {', '.join(ALLOWED_DTYPES)}")
        if not isinstance(self.shape, tuple | list) or not all(
            isinstance(dim, int) and not isinstance(dim, bool) and dim >= 0 for dim in self.shape
        ):
            raise CodecError(f"shape {self.shape!r} is not a sequence of non-negative ints")


@dataclass(frozen=True)
class EncodedTensors:
    """One compressed payload for a list of tensors, with what a receiver needs to check it."""

    codec: str
    specs: list[TensorSpec]
    payload: bytes
    raw_bytes: int
    """Size of the tensors as given (for float32 weights: their float32 size)."""
    wire_bytes: int
    """len(payload): what travels."""

    @property
    def ratio(self) -> float:
        """raw_bytes / wire_bytes (> 1 when the codec saved bytes)."""
        return self.raw_bytes / self.wire_bytes if self.wire_bytes else float("inf")


def _planes(data: bytes | memoryview | np.ndarray, itemsize: int, *, shuffled: bool) -> np.ndarray:
    """Copy of data with its byte planes grouped (shuffled=True) or regrouped into elements."""
    array = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data
    if itemsize < 1:
        raise CodecError(f"itemsize must be >= 1, got {itemsize}")
    if len(array) % itemsize:
        raise CodecError(f"{len(array)} bytes is not a whole number of {itemsize}-byte elements")
    if itemsize == 1:
        return array.copy()
    shape = (-1, itemsize) if shuffled else (itemsize, -1)
    # (n, itemsize) -> (itemsize, n) for shuffle, the reverse for unshuffle. Always a copy
    # (never a view of data, even where the transpose happens to be contiguous): the result
    # must be C-contiguous for zstd and writable for torch.
    return array.reshape(shape).T.copy(order="C").reshape(-1)


def shuffle_bytes(data: bytes | memoryview, itemsize: int) -> bytes:
    """Byte k of every element becomes contiguous: (n, itemsize) -> (itemsize, n).

    Raises CodecError if len(data) is not a multiple of itemsize."""
    return _planes(data, itemsize, shuffled=True).tobytes()


def unshuffle_bytes(data: bytes | memoryview, itemsize: int) -> bytes:
    """Exact inverse of shuffle_bytes for the same itemsize."""
    return _planes(data, itemsize, shuffled=False).tobytes()


def _check_codec(codec: str) -> None:
    if codec not in CODECS:
        raise CodecError(f"unknown codec {codec!r}; known: {', '.join(CODECS)}")


def _wire_dtype(codec: str, dtype: torch.dtype) -> torch.dtype:
    """What travels: bf16 codec rounds floating tensors to bfloat16, integers pass as they are."""
    return torch.bfloat16 if codec == "bf16-shuffle-zstd" and dtype.is_floating_point else dtype


def encode_tensors(tensors: Sequence[torch.Tensor], codec: str, level: int = 3) -> EncodedTensors:
    """Compress tensors (any device, any layout) into one payload.

    raw: the bytes as they are; zstd: one zstd frame of those bytes; shuffle-zstd: byte
    planes of each tensor, then zstd; bf16-shuffle-zstd: floats rounded to bfloat16 first.
    Raises CodecError for an unknown codec, a dtype outside ALLOWED_DTYPES or a bad level.
    """
    _check_codec(codec)
    specs: list[TensorSpec] = []
    chunks: list[np.ndarray] = []
    raw_bytes = 0
    for tensor in tensors:
        name = str(tensor.dtype).removeprefix("torch.")
        if name not in ALLOWED_DTYPES:
            raise CodecError(f"dtype {name} is not allowed; allowed: {', '.join(ALLOWED_DTYPES)}")
        tensor = tensor.detach().cpu().contiguous()
        specs.append(TensorSpec(tuple(tensor.shape), name))
        raw_bytes += tensor.numel() * tensor.element_size()
        wire = tensor.to(_wire_dtype(codec, tensor.dtype)).reshape(-1)  # (numel,)
        if wire.numel() == 0:
            continue  # nothing to send; viewing an empty tensor as bytes is not allowed
        data = wire.view(torch.uint8).numpy()  # (numel * itemsize,), a view, no copy
        # Shuffle per tensor so a plane never straddles two tensors of different item sizes.
        chunks.append(_planes(data, wire.element_size(), shuffled=True) if codec in _SHUFFLED else data)
    if codec == "raw":
        payload = b"".join(chunks)
    else:
        total = sum(chunk.nbytes for chunk in chunks)
        try:
            # The checksum lets the decoder catch a damaged or truncated frame by itself;
            # the pledged size goes into the frame header so receivers can check it first.
            compressor = zstandard.ZstdCompressor(level=level, write_checksum=True).compressobj(size=total)
            payload = b"".join([*(compressor.compress(chunk) for chunk in chunks), compressor.flush()])
        except (zstandard.ZstdError, ValueError) as exc:
            raise CodecError(f"zstd level {level} cannot compress: {exc}") from None
    return EncodedTensors(codec=codec, specs=specs, payload=payload, raw_bytes=raw_bytes,
                          wire_bytes=len(payload))


def _decompress_exactly(payload: bytes | memoryview, expected: int) -> bytes:
    """The zstd frame in payload decompressed to exactly `expected` bytes, never allocating more."""
    try:
        declared = zstandard.frame_content_size(payload)
    except zstandard.ZstdError as exc:
        raise CodecError(f"payload is not a zstd frame: {exc}") from None
    if declared not in (-1, expected):  # -1: the frame does not say
        raise CodecError(f"zstd frame declares {declared} bytes, specs declare {expected}")
    window = max(_MIN_WINDOW_BYTES, 1 << max(expected - 1, 0).bit_length())
    max_window = window if window <= _ZSTD_DEFAULT_MAX_WINDOW_BYTES else 0  # 0: zstd's default
    try:
        # One shot into a buffer of at most `expected` bytes (max_output_size only applies when
        # the frame does not declare its size; when it does, we checked it above). A frame that
        # produces more, stops early, fails its checksum or has bytes after it raises.
        body = zstandard.ZstdDecompressor(max_window_size=max_window).decompress(
            payload, max_output_size=max(expected, 1), allow_extra_data=False)
    except zstandard.ZstdError as exc:
        raise CodecError(f"zstd payload does not decompress to {expected} bytes: {exc}") from None
    if len(body) != expected:
        raise CodecError(f"payload holds {len(body)} bytes, specs declare {expected}")
    return body


def decode_tensors(encoded: EncodedTensors, max_decompressed_bytes: int) -> list[torch.Tensor]:
    """The tensors back, each writable and owning its memory, in the dtype of its spec
    (bf16 codec: floats come back in their original dtype, values rounded through bf16).

    Raises CodecError on an unknown codec, a spec with a bad dtype or shape, specs whose
    total exceeds max_decompressed_bytes, or a payload that is damaged, truncated, has
    trailing bytes or holds a different number of bytes than the specs declare. Nothing
    larger than the specs' total is ever allocated.
    """
    _check_codec(encoded.codec)
    sizes: list[int] = []
    for spec in encoded.specs:
        spec.validate()
        sizes.append(spec.numel * _wire_dtype(encoded.codec, ALLOWED_DTYPES[spec.dtype]).itemsize)
    expected = sum(sizes)
    if expected > max_decompressed_bytes:
        raise CodecError(f"specs declare {expected} bytes, over the bound of {max_decompressed_bytes}")
    if encoded.codec == "raw":
        if len(encoded.payload) != expected:
            raise CodecError(f"payload holds {len(encoded.payload)} bytes, specs declare {expected}")
        body = encoded.payload
    else:
        body = _decompress_exactly(encoded.payload, expected)
    flat = np.frombuffer(body, dtype=np.uint8)  # (expected,), read-only view of body
    tensors, offset = [], 0
    for spec, size in zip(encoded.specs, sizes, strict=True):
        dtype = ALLOWED_DTYPES[spec.dtype]
        wire_dtype = _wire_dtype(encoded.codec, dtype)
        if size == 0:
            tensors.append(torch.empty(spec.shape, dtype=dtype))
            continue
        chunk = flat[offset:offset + size]
        offset += size
        # One copy per tensor: unshuffling copies anyway, and the copy makes the tensor
        # writable and independent of the payload.
        data = _planes(chunk, wire_dtype.itemsize, shuffled=False) if encoded.codec in _SHUFFLED \
            else chunk.copy()
        tensor = torch.from_numpy(data).view(wire_dtype).reshape(spec.shape)
        tensors.append(tensor.to(dtype))
    return tensors


def checksum(payload: bytes | memoryview) -> str:
    """blake2b digest (16 bytes) of payload as 32 hex characters."""
    return hashlib.blake2b(payload, digest_size=16).hexdigest()
