from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest
import torch
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from noloco_rt.outer.codec import (
    ALLOWED_DTYPES,
    CODECS,
    CodecError,
    EncodedTensors,
    TensorSpec,
    checksum,
    decode_tensors,
    encode_tensors,
    is_lossless,
    shuffle_bytes,
    unshuffle_bytes,
)
from noloco_rt.outer.codecs import FAMILIES
from noloco_rt.outer.codecs.base import Codec
from noloco_rt.outer.codecs.sparse import sparse_round_trip

BOUND = 1 << 26
LOSSLESS = ("raw", "zstd", "shuffle-zstd")
QUANTIZED = {"int8-zstd": 127, "int4-zstd": 7, "int2-zstd": 1}
SPARSE = {"topk2-zstd": 2, "topk4-zstd": 4}  # bits per kept entry
"""Quantised codecs and their largest code."""


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
    encoded = encode_tensors([weight, transposed], codec, generator=torch.Generator().manual_seed(0))
    decoded = decode_tensors(encoded, max_decompressed_bytes=BOUND)
    if codec in QUANTIZED:  # the same values in another layout: the same bound, not the same draws
        assert decoded[1].shape == (4, 6) and (decoded[1] - transposed).abs().max() <= weight.abs().max()
        return
    if codec in SPARSE:  # the entries kept of each layout, rounded
        for got, want in zip(decoded, (weight.detach(), transposed), strict=True):
            assert torch.equal(got, sparse_round_trip(want.contiguous().view(-1), SPARSE[codec]).view(want.shape))
        return
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
    assert set(ALLOWED_DTYPES) == {"float32", "bfloat16", "float16", "int64", "int32", "uint8", "int8"}


# -- compression --------------------------------------------------------------------------


def test_shuffle_helps_on_weights_and_sizes_are_reported():
    weights = [torch.randn(256, 256, generator=torch.Generator().manual_seed(0)) * 0.02]
    sizes = {codec: encode_tensors(weights, codec) for codec in CODECS}
    assert sizes["raw"].wire_bytes == sizes["raw"].raw_bytes == 256 * 256 * 4
    assert all(encoded.raw_bytes == 256 * 256 * 4 for encoded in sizes.values())
    assert sizes["shuffle-zstd"].wire_bytes < sizes["zstd"].wire_bytes < sizes["raw"].wire_bytes
    assert sizes["bf16-shuffle-zstd"].wire_bytes < sizes["raw"].raw_bytes / 2
    assert sizes["shuffle-zstd"].ratio > sizes["zstd"].ratio > 1.0
    assert sizes["int4-zstd"].wire_bytes < sizes["int8-zstd"].wire_bytes < sizes["bf16-shuffle-zstd"].wire_bytes


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
    # Not (99,): int4 codes of 99 and of 100 elements are both 50 bytes (int2: 97 to 100 are
    # 25); the sparse codecs keep 2 entries of anything from 65 to 128 elements.
    shapes = {"int2-zstd": [(96,), (101,), (10, 11)]}.get(codec, [(98,), (101,), (10, 11)])
    for shape in shapes if codec not in SPARSE else [(50,), (200,), (64, 64)]:
        with pytest.raises(CodecError, match="declare"):
            decode_tensors(replaced(good, specs=[TensorSpec(shape, "float32")]), max_decompressed_bytes=BOUND)
    exact = FAMILIES[codec].body_bytes(TensorSpec((100,), "float32"))
    with pytest.raises(CodecError, match="over the bound"):
        decode_tensors(good, max_decompressed_bytes=exact - 1)


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


# -- quantised codecs ---------------------------------------------------------------------
#
# Reference: block b of a flat float tensor of n elements holds elements [64b, 64b + 64);
# its stored scale is absmax / max_code rounded up to a float32, the codes follow the
# scales. The error of one element is |q·s − x| < s exactly, plus the float32 rounding of
# q·s (at most 2^-24 · max_code · s), so |x̂ − x| <= s · (1 + 2^-16) for both codecs.

ERROR_SLACK = 1 + 2**-16


def body_of(encoded: EncodedTensors) -> bytes:
    return zstandard.ZstdDecompressor().decompress(encoded.payload)


def reframed(encoded: EncodedTensors, body: bytes | bytearray) -> EncodedTensors:
    """The same specs with `body` in a fresh, honest zstd frame."""
    payload = zstandard.ZstdCompressor(write_checksum=True).compress(bytes(body))
    return replaced(encoded, payload=payload, wire_bytes=len(payload))


def expected_scales(flat: np.ndarray, max_code: int) -> np.ndarray:
    """Per block: absmax / max_code rounded up to float32 (blocks,)."""
    blocks = [flat[k:k + 64] for k in range(0, len(flat), 64)]
    exact = np.array([np.abs(b.astype(np.float64)).max() / max_code for b in blocks])
    scales = exact.astype(np.float32)
    return np.where(scales.astype(np.float64) < exact, np.nextafter(scales, np.float32(np.inf)), scales)


def quantized_body_bytes(numel: int, codec: str) -> int:
    codes = {"int8-zstd": numel, "int4-zstd": (numel + 1) // 2, "int2-zstd": (numel + 3) // 4}[codec]
    return 4 * math.ceil(numel / 64) + codes


finite_float32s = st.floats(min_value=-(2.0**126), max_value=2.0**126, width=32)  # q·s stays below float32 max


@settings(max_examples=80, deadline=None)
@given(tensor=float_tensors(finite_float32s) | st.integers(0, 300).map(lambda n: torch.randn(n) * 0.02),
       codec=st.sampled_from(sorted(QUANTIZED)), seed=st.integers(0, 2**32))
def test_quantized_round_trip_within_a_scale_of_its_block(tensor, codec, seed):
    encoded = encode_tensors([tensor], codec, generator=torch.Generator().manual_seed(seed))
    body = body_of(encoded)
    n = tensor.numel()
    assert len(body) == quantized_body_bytes(n, codec)
    (decoded,) = decode_tensors(encoded, max_decompressed_bytes=BOUND)
    assert decoded.shape == tensor.shape and decoded.dtype == torch.float32
    if n == 0:
        return
    flat = tensor.reshape(-1).numpy()
    scales = np.frombuffer(body[:4 * math.ceil(n / 64)], dtype="<f4")
    np.testing.assert_array_equal(scales, expected_scales(flat, QUANTIZED[codec]))
    per_element = np.repeat(scales.astype(np.float64), 64)[:n]
    error = np.abs(decoded.reshape(-1).numpy().astype(np.float64) - flat)
    assert (error <= per_element * ERROR_SLACK).all()


@pytest.mark.parametrize("codec", sorted(QUANTIZED))
def test_quantized_sizes_are_exact(codec):
    for n in (1, 2, 3, 63, 64, 65, 127, 128, 129, 1001):
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            encoded = encode_tensors([torch.randn(n).to(dtype)], codec)
            assert zstandard.frame_content_size(encoded.payload) == quantized_body_bytes(n, codec)
            assert encoded.raw_bytes == n * dtype.itemsize and encoded.wire_bytes == len(encoded.payload)
            (decoded,) = decode_tensors(encoded, max_decompressed_bytes=quantized_body_bytes(n, codec))
            assert decoded.dtype == dtype
    mixed = [torch.zeros(0, 4), torch.randn(65), torch.arange(5, dtype=torch.int64), torch.zeros((), dtype=torch.uint8)]
    encoded = encode_tensors(mixed, codec)
    assert zstandard.frame_content_size(encoded.payload) == quantized_body_bytes(65, codec) + 5 * 8 + 1


@pytest.mark.parametrize("codec", sorted(QUANTIZED))
def test_quantized_codecs_leave_integers_and_empty_tensors_exact(codec):
    generator = torch.Generator().manual_seed(3)
    integers = [torch.randint(-(2**62), 2**62, (4, 3), generator=generator, dtype=torch.int64),
                torch.randint(-(2**31), 2**31 - 1, (7,), generator=generator, dtype=torch.int32),
                torch.randint(0, 256, (9,), generator=generator, dtype=torch.uint8)]
    empties = [torch.zeros(0), torch.zeros(3, 0, dtype=torch.bfloat16), torch.zeros(0, dtype=torch.int64)]
    tensors = [*integers, torch.randn(10), *empties]
    decoded = decode_tensors(encode_tensors(tensors, codec), max_decompressed_bytes=BOUND)
    for got, want in zip(decoded[:3] + decoded[4:], integers + empties, strict=True):
        assert_same(got, want)
    zeros = decode_tensors(encode_tensors([torch.zeros(70)], codec), max_decompressed_bytes=BOUND)[0]
    assert_same(zeros, torch.zeros(70))  # an all-zero block has scale 0 and decodes exactly


@pytest.mark.parametrize("codec", sorted(QUANTIZED))
def test_stochastic_rounding_is_unbiased(codec):
    # Every block holds ±max_code·c (so its scale is exactly c) and values c·(j + 0.3): their
    # codes are j or j + 1. Rounding to nearest would be off by 0.3·c in every element; the
    # mean of N stochastic draws is off by at most 5 standard deviations of a mean of N
    # codes of variance <= 1/4, i.e. 5·c / (2·sqrt(N)) (about 0.08·c for N = 1000).
    max_code, c, draws = QUANTIZED[codec], 2.0**-6, 1000
    grid = [j + 0.3 for j in range(-max_code, max_code)]
    block = torch.tensor(([max_code, -max_code] + grid * 64)[:64]) * c
    x = torch.cat([block, block[:37]])  # two blocks, the second one shorter
    total = torch.zeros_like(x, dtype=torch.float64)
    for seed in range(draws):
        encoded = encode_tensors([x], codec, generator=torch.Generator().manual_seed(seed))
        total += decode_tensors(encoded, max_decompressed_bytes=BOUND)[0].double()
    tolerance = 5 * c / (2 * math.sqrt(draws))
    assert float((total / draws - x.double()).abs().max()) <= tolerance
    nearest = torch.round(x / c) * c
    assert float((nearest - x).abs().max()) > 3 * tolerance  # the test could tell a biased rounding


def test_the_generator_decides_the_draws():
    x = torch.randn(500, generator=torch.Generator().manual_seed(0))

    def payload(seed: int | None) -> bytes:
        generator = None if seed is None else torch.Generator().manual_seed(seed)
        return encode_tensors([x], "int8-zstd", generator=generator).payload

    assert payload(1) == payload(1) and payload(1) != payload(2)
    assert payload(None) != payload(None)  # fresh from os.urandom each time


def _first_scale_replaced(encoded: EncodedTensors, value: float) -> EncodedTensors:
    body = bytearray(body_of(encoded))
    body[0:4] = np.array([value], dtype="<f4").tobytes()
    return reframed(encoded, body)


@pytest.mark.parametrize("codec", sorted(QUANTIZED))
@pytest.mark.parametrize("scale", [math.nan, math.inf, -math.inf, -1.0, -1e-30])
def test_a_bad_scale_is_refused(codec, scale):
    good = encode_tensors([torch.randn(100)], codec)
    assert decode_tensors(_first_scale_replaced(good, 0.5), max_decompressed_bytes=BOUND)  # reframing is honest
    with pytest.raises(CodecError, match="scale"):
        decode_tensors(_first_scale_replaced(good, scale), max_decompressed_bytes=BOUND)


@pytest.mark.parametrize("codec", sorted(QUANTIZED))
def test_non_finite_values_encode_to_a_payload_receivers_refuse(codec):
    for poison in (math.nan, math.inf):
        x = torch.randn(130)
        x[70] = poison
        encoded = encode_tensors([x], codec)
        scales = np.frombuffer(body_of(encoded)[:12], dtype="<f4")
        assert np.isfinite(scales[[0, 2]]).all() and np.isnan(scales[1])
        with pytest.raises(CodecError, match="scale"):
            decode_tensors(encoded, max_decompressed_bytes=BOUND)


def test_int8_code_minus_128_is_refused():
    good = encode_tensors([torch.randn(100)], "int8-zstd")
    body = bytearray(body_of(good))
    body[8 + 17] = 0x80  # after the two scales: element 17's code
    with pytest.raises(CodecError, match="-128"):
        decode_tensors(reframed(good, body), max_decompressed_bytes=BOUND)
    body[8 + 17] = 0x81  # -127 is fine
    decode_tensors(reframed(good, body), max_decompressed_bytes=BOUND)


@pytest.mark.parametrize("numel", [100, 99])
def test_int4_nibble_0_and_bad_padding_are_refused(numel):
    good = encode_tensors([torch.randn(numel)], "int4-zstd")
    body = bytearray(body_of(good))
    codes_at = 8  # after the two scales
    body[codes_at + 3] = (body[codes_at + 3] & 0xF0) | 0x0  # element 6: code -8
    with pytest.raises(CodecError, match="nibble 0"):
        decode_tensors(reframed(good, body), max_decompressed_bytes=BOUND)
    body = bytearray(body_of(good))
    body[codes_at + 3] = (body[codes_at + 3] & 0x0F) | 0x10  # element 7: nibble 1, code -7 (allowed)
    decode_tensors(reframed(good, body), max_decompressed_bytes=BOUND)
    if numel % 2:
        assert body[-1] >> 4 == 8  # the padding nibble is the code 0
        body[-1] = (body[-1] & 0x0F) | 0x90
        with pytest.raises(CodecError, match="padding"):
            decode_tensors(reframed(good, body), max_decompressed_bytes=BOUND)


@pytest.mark.parametrize("numel", [100, 98])
def test_int2_value_3_and_bad_padding_are_refused(numel):
    good = encode_tensors([torch.randn(numel)], "int2-zstd")
    body = bytearray(body_of(good))
    codes_at = 8  # after the two scales: four 2-bit values a byte
    body[codes_at + 2] |= 0x0C  # element 9: value 3, no code
    with pytest.raises(CodecError, match="value 3"):
        decode_tensors(reframed(good, body), max_decompressed_bytes=BOUND)
    body = bytearray(body_of(good))
    body[codes_at + 2] = (body[codes_at + 2] & 0xF3) | 0x08  # element 9: value 2, code 1 (allowed)
    decode_tensors(reframed(good, body), max_decompressed_bytes=BOUND)
    if numel % 4:
        assert body[-1] >> 6 == 1  # the padding is the code 0
        body[-1] = (body[-1] & 0x3F) | 0x80
        with pytest.raises(CodecError, match="padding"):
            decode_tensors(reframed(good, body), max_decompressed_bytes=BOUND)


@pytest.mark.parametrize("codec", sorted(QUANTIZED))
def test_quantized_bodies_of_another_size_and_oversized_specs_are_refused(codec):
    good = encode_tensors([torch.randn(100)], codec)
    body = body_of(good)
    for wrong in (body[:-1], body + b"\x01", body[4:]):
        with pytest.raises(CodecError, match="declare"):
            decode_tensors(reframed(good, wrong), max_decompressed_bytes=BOUND)
    huge = replaced(good, specs=[TensorSpec((1 << 40,), "float32")])
    tracemalloc.start()
    try:
        with pytest.raises(CodecError, match="over the bound"):
            decode_tensors(huge, max_decompressed_bytes=BOUND)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    exact = quantized_body_bytes(100, codec)
    assert decode_tensors(good, max_decompressed_bytes=exact)
    with pytest.raises(CodecError, match="over the bound"):
        decode_tensors(good, max_decompressed_bytes=exact - 1)


def test_every_codec_name_has_one_family():
    assert tuple(FAMILIES) == CODECS
    assert {name for name in CODECS if is_lossless(name)} == set(LOSSLESS)
    assert all(isinstance(family, Codec) and family.name == name for name, family in FAMILIES.items())


def test_the_lossless_list_that_bootstraps_use_agrees_with_the_codecs():
    from noloco_rt.config.choices import CODECS, LOSSLESS_CODECS
    from noloco_rt.outer.codecs import is_lossless

    assert set(LOSSLESS_CODECS) == {name for name in CODECS if is_lossless(name)}


@pytest.mark.parametrize("codec", ["int8-zstd", "int4-zstd", "int2-zstd"])
def test_codes_quantised_elsewhere_pack_into_the_payload_the_host_codec_gives(codec):
    """On a GPU the outer step quantises on the device and the host only packs the codes: with
    the same random draws the payload is byte for byte the host codec's, so receivers decode
    it as any other."""
    from noloco_rt.outer.codec import encode_quantized_tensors
    from noloco_rt.outer.codecs.quantized import QuantizedTensor, quantize

    tensors = [torch.randn(300), torch.randn(64), torch.randn(1)]
    family = FAMILIES[codec]
    host = encode_tensors(tensors, codec, generator=torch.Generator().manual_seed(5))
    rounding = torch.Generator().manual_seed(5)
    elsewhere = encode_quantized_tensors([QuantizedTensor(*quantize(t, family.max_code, rounding)) for t in tensors],
                                         codec)
    assert elsewhere.payload == host.payload and elsewhere.specs == host.specs
    assert (elsewhere.raw_bytes, elsewhere.wire_bytes) == (host.raw_bytes, host.wire_bytes)
    with pytest.raises(CodecError, match="not a blockwise quantised codec"):
        encode_quantized_tensors([], "shuffle-zstd")


def test_a_quantised_piece_is_the_blocks_of_its_elements_and_starts_at_a_block():
    from noloco_rt.outer.codecs.quantized import QuantizedTensor, quantize

    whole = QuantizedTensor(*quantize(torch.randn(200), 127, torch.Generator().manual_seed(1)))
    piece = whole.piece(128, 72)
    assert torch.equal(piece.codes, whole.codes[128:]) and torch.equal(piece.scales, whole.scales[2:4])
    with pytest.raises(ValueError, match="multiple of 64"):
        whole.piece(100, 10)
    with pytest.raises(CodecError, match="scales for"):
        FAMILIES["int8-zstd"].encode_quantized(whole.scales[:1], whole.codes)
