"""One zstd frame around a snapshot's body, and its bounded decompression (pure).

Decompression is bounded: the caller fixes the exact output size from the specs, a frame
that declares another size is refused before anything is allocated, and one that does not
declare it is decoded into a buffer of exactly that size and refused if it overflows.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import zstandard

from noloco_rt.outer.codecs.base import CodecError

# zstd's own decoder limit is a 128 MiB window. A frame that does not declare its content
# size may still claim that window and make the decoder allocate it for a tiny output, so
# the window is capped near the output size; 1 MiB of slack costs nothing and keeps
# honest frames well inside the cap.
_MIN_WINDOW_BYTES = 1 << 20
_ZSTD_DEFAULT_MAX_WINDOW_BYTES = 1 << 27


def compress_frame(chunks: Sequence[np.ndarray], level: int) -> bytes:
    """One zstd frame of the chunks in order, with its content size and a checksum."""
    total = sum(chunk.nbytes for chunk in chunks)
    try:
        # The checksum lets the decoder catch a damaged or truncated frame by itself;
        # the pledged size goes into the frame header so receivers can check it first.
        compressor = zstandard.ZstdCompressor(level=level, write_checksum=True).compressobj(size=total)
        return b"".join([*(compressor.compress(chunk) for chunk in chunks), compressor.flush()])
    except (zstandard.ZstdError, ValueError) as exc:
        raise CodecError(f"zstd level {level} cannot compress: {exc}") from None


def decompress_exactly(payload: bytes | memoryview, expected: int) -> bytes:
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
