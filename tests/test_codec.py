from __future__ import annotations

import pytest
import torch
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from noloco_rt.codec import (
    CODECS,
    CodecError,
    EncodedTensors,
    TensorSpec,
    checksum,
    decode_tensors,
    encode_tensors,
    shuffle_bytes,
    unshuffle_bytes,
)

BOUND = 1 << 26


@given(data=st.binary(max_size=400), itemsize=st.sampled_from([1, 2, 4, 8]))
def test_shuffle_is_inverted_by_unshuffle(data, itemsize):
    data = data[: len(data) - len(data) % itemsize]
    assert unshuffle_bytes(shuffle_bytes(data, itemsize), itemsize) == data


def test_shuffle_groups_byte_planes():
    assert shuffle_bytes(bytes([1, 2, 3, 4, 5, 6, 7, 8]), 4) == bytes([1, 5, 2, 6, 3, 7, 4, 8])
    with pytest.raises(CodecError):
        shuffle_bytes(b"abc", 2)


shapes = st.lists(st.lists(st.integers(0, 6), min_size=0, max_size=3), min_size=1, max_size=4)


@given(shape_list=shapes, seed=st.integers(0, 1000), codec=st.sampled_from(["raw", "zstd", "shuffle-zstd"]))
def test_lossless_codecs_round_trip_exactly(shape_list, seed, codec):
    generator = torch.Generator().manual_seed(seed)
    tensors = [torch.randn(tuple(shape), generator=generator) for shape in shape_list]
    tensors.append(torch.arange(5, dtype=torch.int64))
    encoded = encode_tensors(tensors, codec)
    decoded = decode_tensors(encoded, max_decompressed_bytes=BOUND)
    assert len(decoded) == len(tensors)
    for got, want in zip(decoded, tensors, strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_bf16_codec_rounds_through_bfloat16():
    tensors = [torch.randn(64, 32), torch.randn(7)]
    decoded = decode_tensors(encode_tensors(tensors, "bf16-shuffle-zstd"), max_decompressed_bytes=BOUND)
    for got, want in zip(decoded, tensors, strict=True):
        assert got.dtype == torch.float32
        assert torch.equal(got, want.bfloat16().float())


def test_shuffle_helps_on_weights_and_sizes_are_reported():
    weights = [torch.randn(256, 256) * 0.02]
    sizes = {codec: encode_tensors(weights, codec) for codec in CODECS}
    assert sizes["raw"].wire_bytes == sizes["raw"].raw_bytes == 256 * 256 * 4
    assert sizes["shuffle-zstd"].wire_bytes < sizes["zstd"].wire_bytes
    assert sizes["bf16-shuffle-zstd"].wire_bytes < sizes["raw"].raw_bytes / 2
    assert sizes["shuffle-zstd"].ratio > 1.0


def test_zstd_bomb_is_refused_within_the_bound():
    bomb = zstandard.ZstdCompressor().compress(bytes(100 * 1024 * 1024))
    lying = EncodedTensors("zstd", [TensorSpec((1024,), "float32")], bomb, 4096, len(bomb))
    with pytest.raises(CodecError, match="declares 104857600 bytes"):
        decode_tensors(lying, max_decompressed_bytes=1 << 20)
    huge = EncodedTensors("zstd", [TensorSpec((1 << 30,), "float32")], bomb, 1 << 32, len(bomb))
    with pytest.raises(CodecError, match="exceed the bound"):
        decode_tensors(huge, max_decompressed_bytes=1 << 20)


def test_damaged_payloads_are_refused():
    good = encode_tensors([torch.randn(100)], "shuffle-zstd")
    truncated = EncodedTensors(good.codec, good.specs, good.payload[:-10], good.raw_bytes, good.wire_bytes)
    with pytest.raises(CodecError):
        decode_tensors(truncated, max_decompressed_bytes=BOUND)
    wrong_size = EncodedTensors("raw", [TensorSpec((10,), "float32")], b"\0" * 39, 40, 39)
    with pytest.raises(CodecError, match="declare"):
        decode_tensors(wrong_size, max_decompressed_bytes=BOUND)
    with pytest.raises(CodecError, match="not allowed"):
        decode_tensors(EncodedTensors("raw", [TensorSpec((1,), "complex64")], b"\0" * 8, 8, 8),
                       max_decompressed_bytes=BOUND)
    with pytest.raises(CodecError, match="unknown codec"):
        encode_tensors([torch.zeros(1)], "lz4")


def test_checksum_changes_with_one_bit():
    payload = bytearray(encode_tensors([torch.randn(50)], "zstd").payload)
    before = checksum(bytes(payload))
    payload[3] ^= 1
    assert checksum(bytes(payload)) != before and len(before) == 32


def test_bomb_without_declared_size_is_read_only_up_to_the_bound():
    compressor = zstandard.ZstdCompressor(write_content_size=False)
    bomb = compressor.compress(bytes(50 * 1024 * 1024))
    assert zstandard.frame_content_size(bomb) == -1
    lying = EncodedTensors("zstd", [TensorSpec((1024,), "float32")], bomb, 4096, len(bomb))
    with pytest.raises(CodecError, match="payload holds 4097 bytes"):
        decode_tensors(lying, max_decompressed_bytes=1 << 20)
