from __future__ import annotations

import tracemalloc

import pytest
import torch
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from noloco_rt.net.codec import (
    ALLOWED_DTYPES,
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
LOSSLESS = ("raw", "zstd", "shuffle-zstd")


def bits(tensor: torch.Tensor) -> bytes:
    """The exact bytes of a tensor (NaN payloads and signed zeros included)."""
    if tensor.numel() == 0:
        return b""
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    assert bits(got) == bits(want)


def replaced(encoded: EncodedTensors, **changes) -> EncodedTensors:
    fields = dict(codec=encoded.codec, specs=encoded.specs, payload=encoded.payload,
                  raw_bytes=encoded.raw_bytes, wire_bytes=encoded.wire_bytes)
    fields.update(changes)
    return EncodedTensors(**fields)


# -- shuffle ------------------------------------------------------------------------------


@given(data=st.binary(max_size=512), itemsize=st.sampled_from([1, 2, 3, 4, 8]))
def test_unshuffle_inverts_shuffle(data, itemsize):
    data = data[: len(data) - len(data) % itemsize]
    shuffled = shuffle_bytes(data, itemsize)
    assert len(shuffled) == len(data)
    assert unshuffle_bytes(shuffled, itemsize) == data
    assert shuffle_bytes(unshuffle_bytes(data, itemsize), itemsize) == data


def test_shuffle_groups_byte_planes():
    # Elements [1 2 3 4] and [5 6 7 8]: plane k holds byte k of every element.
    assert shuffle_bytes(bytes([1, 2, 3, 4, 5, 6, 7, 8]), 4) == bytes([1, 5, 2, 6, 3, 7, 4, 8])
    assert shuffle_bytes(bytes([1, 2, 3, 4, 5, 6]), 2) == bytes([1, 3, 5, 2, 4, 6])
    assert shuffle_bytes(b"abc", 1) == b"abc"
    with pytest.raises(CodecError, match="whole number"):
        shuffle_bytes(b"abc", 2)
    with pytest.raises(CodecError, match="whole number"):
        unshuffle_bytes(b"abcde", 4)


# -- round trips --------------------------------------------------------------------------

float32s = st.floats(width=32, allow_nan=True, allow_infinity=True)
shapes = st.lists(st.integers(0, 5), max_size=3).map(tuple)


@st.composite
def float_tensors(draw, values=float32s):
    shape = draw(shapes)
    numel = 1
    for dim in shape:
        numel *= dim
    data = draw(st.lists(values, min_size=numel, max_size=numel))
    return torch.tensor(data, dtype=torch.float32).reshape(shape)


def mixed_dtypes(seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [
        torch.randn(3, 5, generator=generator).to(torch.bfloat16),
        torch.randn(7, generator=generator).to(torch.float16),
        torch.randint(-(2**62), 2**62, (4,), generator=generator, dtype=torch.int64),
        torch.randint(-(2**31), 2**31 - 1, (2, 3), generator=generator, dtype=torch.int32),
        torch.randint(0, 256, (9,), generator=generator, dtype=torch.uint8),
        torch.zeros(0, 4),
    ]


@settings(max_examples=60, deadline=None)
@given(tensors=st.lists(float_tensors(), max_size=4), seed=st.integers(0, 1000),
       codec=st.sampled_from(LOSSLESS))
def test_lossless_codecs_round_trip_exactly(tensors, seed, codec):
    tensors = tensors + mixed_dtypes(seed)
    encoded = encode_tensors(tensors, codec)
    assert [spec.shape for spec in encoded.specs] == [tuple(t.shape) for t in tensors]
    assert encoded.raw_bytes == sum(t.numel() * t.element_size() for t in tensors)
    assert encoded.wire_bytes == len(encoded.payload)
    decoded = decode_tensors(encoded, max_decompressed_bytes=BOUND)
    assert len(decoded) == len(tensors)
    for got, want in zip(decoded, tensors, strict=True):
        assert_same(got, want)


@settings(max_examples=60, deadline=None)
@given(tensors=st.lists(float_tensors(st.floats(width=32, allow_nan=False)), min_size=1, max_size=4))
def test_bf16_codec_rounds_floats_through_bfloat16(tensors):
    ints = torch.arange(-3, 3, dtype=torch.int64)
    half = torch.tensor([1.0009765625, -2.5], dtype=torch.float16)
    encoded = encode_tensors([*tensors, ints, half], "bf16-shuffle-zstd")
    decoded = decode_tensors(encoded, max_decompressed_bytes=BOUND)
    for got, want in zip(decoded[: len(tensors)], tensors, strict=True):
        assert_same(got, want.bfloat16().float())  # float32 in, float32 out, bf16 precision
    assert_same(decoded[-2], ints)  # integers travel untouched
    assert_same(decoded[-1], half.bfloat16().half())
    assert encoded.raw_bytes == sum(t.numel() * 4 for t in tensors) + 6 * 8 + 2 * 2


@pytest.mark.parametrize("codec", CODECS)
def test_empty_list_and_awkward_inputs(codec):
    assert decode_tensors(encode_tensors([], codec), max_decompressed_bytes=0) == []
    weight = torch.randn(6, 4, requires_grad=True)
    transposed = weight.detach().t()  # not contiguous
    decoded = decode_tensors(encode_tensors([weight, transposed], codec), max_decompressed_bytes=BOUND)
    expected = weight.detach() if codec != "bf16-shuffle-zstd" else weight.detach().bfloat16().float()
    assert torch.equal(decoded[0], expected) and torch.equal(decoded[1], expected.t())


def test_decoded_tensors_are_writable_and_independent():
    encoded = encode_tensors([torch.ones(8)], "raw")
    first = decode_tensors(encoded, max_decompressed_bytes=BOUND)[0]
    first.add_(1)  # must neither warn nor touch the payload
    assert torch.equal(decode_tensors(encoded, max_decompressed_bytes=BOUND)[0], torch.ones(8))


def test_unknown_codec_and_dtype():
    with pytest.raises(CodecError, match="unknown codec"):
        encode_tensors([torch.zeros(1)], "lz4")
    with pytest.raises(CodecError, match="not allowed"):
        encode_tensors([torch.zeros(1, dtype=torch.complex64)], "raw")
    with pytest.raises(CodecError, match="not allowed"):
        encode_tensors([torch.zeros(1, dtype=torch.float64)], "zstd")
    with pytest.raises(CodecError, match="level"):
        encode_tensors([torch.zeros(1)], "zstd", level=99)
    good = encode_tensors([torch.zeros(2)], "raw")
    with pytest.raises(CodecError, match="unknown codec"):
        decode_tensors(replaced(good, codec="lz4"), max_decompressed_bytes=BOUND)
    with pytest.raises(CodecError, match="not allowed"):
        decode_tensors(replaced(good, specs=[TensorSpec((1,), "complex64")]), max_decompressed_bytes=BOUND)
    with pytest.raises(CodecError, match="non-negative ints"):
        decode_tensors(replaced(good, specs=[TensorSpec((-1, -8), "float32")]), max_decompressed_bytes=BOUND)
    assert set(ALLOWED_DTYPES) == {"float32", "bfloat16", "float16", "int64", "int32", "uint8"}


# -- compression --------------------------------------------------------------------------


def test_shuffle_helps_on_weights_and_sizes_are_reported():
    weights = [torch.randn(256, 256, generator=torch.Generator().manual_seed(0)) * 0.02]
    sizes = {codec: encode_tensors(weights, codec) for codec in CODECS}
    assert sizes["raw"].wire_bytes == sizes["raw"].raw_bytes == 256 * 256 * 4
    assert all(encoded.raw_bytes == 256 * 256 * 4 for encoded in sizes.values())
    assert sizes["shuffle-zstd"].wire_bytes < sizes["zstd"].wire_bytes < sizes["raw"].wire_bytes
    assert sizes["bf16-shuffle-zstd"].wire_bytes < sizes["raw"].raw_bytes / 2
    assert sizes["shuffle-zstd"].ratio > sizes["zstd"].ratio > 1.0


# -- hostile payloads ---------------------------------------------------------------------


def test_zstd_bomb_is_refused_before_allocating_it():
    bomb = zstandard.ZstdCompressor().compress(bytes(100 * 1024 * 1024))  # declares 100 MB
    assert len(bomb) < 10_000
    lying = EncodedTensors("zstd", [TensorSpec((1024,), "float32")], bomb, 4096, len(bomb))
    tracemalloc.start()
    try:
        with pytest.raises(CodecError, match="declares 104857600 bytes"):
            decode_tensors(lying, max_decompressed_bytes=1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    honest_specs = replaced(lying, specs=[TensorSpec((25 * 1024 * 1024,), "float32")])
    with pytest.raises(CodecError, match="over the bound"):
        decode_tensors(honest_specs, max_decompressed_bytes=1 << 20)


def test_bomb_without_declared_size_is_cut_at_the_declared_specs():
    compressor = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    bomb = compressor.compress(bytes(100 * 1024 * 1024)) + compressor.flush()
    assert zstandard.frame_content_size(bomb) == -1
    lying = EncodedTensors("zstd", [TensorSpec((1024,), "float32")], bomb, 4096, len(bomb))
    tracemalloc.start()
    try:
        with pytest.raises(CodecError, match="does not decompress to 4096 bytes"):
            decode_tensors(lying, max_decompressed_bytes=1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # the output buffer never grew past the 4 KiB the specs declare


def test_frame_claiming_a_huge_window_is_refused():
    # Unknown content size and a 128 MiB window: decoding it would reserve the window.
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=27, write_content_size=False)
    compressor = zstandard.ZstdCompressor(compression_params=params).compressobj()
    payload = compressor.compress(bytes(4096)) + compressor.flush()
    encoded = EncodedTensors("zstd", [TensorSpec((1024,), "float32")], payload, 4096, len(payload))
    with pytest.raises(CodecError, match="memory"):
        decode_tensors(encoded, max_decompressed_bytes=BOUND)


@settings(max_examples=40, deadline=None)
@given(codec=st.sampled_from(CODECS), cut=st.integers(1, 64))
def test_truncated_payload_is_refused(codec, cut):
    good = encode_tensors([torch.randn(300, generator=torch.Generator().manual_seed(1))], codec)
    truncated = replaced(good, payload=good.payload[:-cut])
    with pytest.raises(CodecError):
        decode_tensors(truncated, max_decompressed_bytes=BOUND)


@pytest.mark.parametrize("codec", CODECS)
def test_trailing_bytes_and_size_disagreements_are_refused(codec):
    good = encode_tensors([torch.randn(100)], codec)
    with pytest.raises(CodecError):
        decode_tensors(replaced(good, payload=good.payload + b"\0" * 8), max_decompressed_bytes=BOUND)
    for shape in [(99,), (101,), (10, 11)]:
        with pytest.raises(CodecError, match="declare"):
            decode_tensors(replaced(good, specs=[TensorSpec(shape, "float32")]), max_decompressed_bytes=BOUND)
    with pytest.raises(CodecError, match="over the bound"):
        decode_tensors(good, max_decompressed_bytes=100)


def test_corrupted_frame_is_refused():
    good = encode_tensors([torch.randn(1000)], "shuffle-zstd")
    damaged = bytearray(good.payload)
    damaged[len(damaged) // 2] ^= 0xFF
    with pytest.raises(CodecError):
        decode_tensors(replaced(good, payload=bytes(damaged)), max_decompressed_bytes=BOUND)
    with pytest.raises(CodecError, match="not a zstd frame"):
        decode_tensors(replaced(good, payload=b"not zstd at all"), max_decompressed_bytes=BOUND)


# -- checksum -----------------------------------------------------------------------------


@given(payload=st.binary(min_size=1, max_size=256), data=st.data())
def test_checksum_changes_when_a_bit_flips(payload, data):
    position = data.draw(st.integers(0, len(payload) - 1))
    bit = data.draw(st.integers(0, 7))
    flipped = bytearray(payload)
    flipped[position] ^= 1 << bit
    digest = checksum(payload)
    assert len(digest) == 32 and int(digest, 16) >= 0
    assert checksum(memoryview(payload)) == digest
    assert checksum(bytes(flipped)) != digest
