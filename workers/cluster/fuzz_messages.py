"""Hostile messages for fuzzing a live worker (fuzz_live.py): random and mutated frames for
its data socket and its exchange socket, each built to be invalid."""

from __future__ import annotations

import functools
import math
import random
import struct
from collections.abc import Callable
from typing import Any

import msgpack
import torch
import zstandard

from noloco_rt.model.llama import build_stage
from noloco_rt.net.wire import PROTOCOL_VERSION
from noloco_rt.outer.codec import checksum, encode_tensors
from noloco_rt.outer.codecs import codec_named
from noloco_rt.outer.codecs.base import TensorSpec
from noloco_rt.outer.codecs.sparse import chunk_lengths, kept_count

RUN_ID = "default"
TARGET_STAGE = 1
BATCH, SEQ, DIM = 8, 64, 64  # the cluster's defaults: tiny preset, batch 8 × 64 tokens

Frames = list[bytes]


def _header(kind: str = "forward", **fields: Any) -> dict[str, Any]:
    base = {"version": PROTOCOL_VERSION, "run_id": RUN_ID, "kind": kind, "sender": "fuzzer", "microbatch_id": 1,
            "attempt": 0, "outer_step": 1, "stage": TARGET_STAGE - 1, "codec": "raw", "tensors": [], "extra": {}}
    base.update(fields)
    return base


def _pack(header: Any) -> bytes:
    return msgpack.packb(header, use_bin_type=True)


def _forward(rng: random.Random) -> tuple[dict[str, Any], Frames]:
    """A well-formed forward (activations (B, T, C) float32, targets (B, T) int64)."""
    acts = torch.randn(BATCH, SEQ, DIM).numpy().tobytes()
    targets = torch.randint(0, 256, (BATCH, SEQ)).numpy().tobytes()
    specs = [{"shape": [BATCH, SEQ, DIM], "dtype": "float32", "nbytes": len(acts)},
             {"shape": [BATCH, SEQ], "dtype": "int64", "nbytes": len(targets)}]
    return _header(tensors=specs, extra={"reply_to": "tcp://127.0.0.1:1"}), [acts, targets]


@functools.cache
def stage_shapes() -> list[tuple[int, ...]]:
    module = build_stage("tiny", vocab_size=256, stage=TARGET_STAGE, num_stages=2, seed=0)
    return [tuple(p.shape) for p in module.parameters()]


@functools.cache
def _zstd_bombs() -> tuple[bytes, bytes]:
    """Small zstd frames that decompress to 2 GiB of zeros: one declaring its size, one not."""
    zeros = bytes(1 << 20)
    bombs = []
    for declare in (True, False):
        params = zstandard.ZstdCompressionParameters.from_level(1, write_content_size=declare)
        compressor = zstandard.ZstdCompressor(compression_params=params).compressobj(size=2 << 30)
        bombs.append(b"".join([*(compressor.compress(zeros) for _ in range(2048)), compressor.flush()]))
    return bombs[0], bombs[1]


def sparse_layout(numel: int) -> tuple[int, int]:
    """(chunks, kept entries) of a tensor of numel elements under the sparse codecs."""
    return len(chunk_lengths(numel)), kept_count(numel)


def _whole_pieces() -> list[list[int]]:
    """A one-chunk push: every tensor whole, as its 1-D piece."""
    return [[i, 0, math.prod(s)] for i, s in enumerate(stage_shapes())]


def snapshot_push(payload: bytes, *, specs: list | None = None, digest: str | None = None,
                      codec: str = "shuffle-zstd", parts: str = "fast", chunk: Any = (0, 1),
                      pieces: Any = None, **fields: Any) -> Frames:
    pieces = pieces if pieces is not None else _whole_pieces()
    specs = specs if specs is not None else [[[count], "float32"] for _, _, count in _whole_pieces()]
    extra = {"codec": codec, "parts": parts, "specs": specs, "chunk": list(chunk) if chunk else chunk,
             "pieces": pieces, "for_step": 1 << 30,  # never a step the target is past
             "checksum": digest if digest is not None else checksum(payload), "counters": {}}
    header = _header("snapshot_push", stage=TARGET_STAGE, outer_step=1,
                     tensors=[{"shape": [len(payload)], "dtype": "uint8", "nbytes": len(payload)}], extra=extra)
    header.update(fields)
    return [_pack(header), payload]


# Honest snapshots to mutate are encoded with one of these (the quantised ones have scales
# and codes of their own to get wrong).
FUZZ_CODECS = ("shuffle-zstd", "int8-zstd", "int4-zstd", "int2-zstd")


def _honest_payload(scale: float = 1.0, nan: bool = False, codec: str = "shuffle-zstd", seed: int = 0) -> bytes:
    tensors = [torch.randn(s) * scale for s in stage_shapes()]
    if nan:
        tensors[0].view(-1)[0] = math.nan
    return encode_tensors(tensors, codec, generator=torch.Generator().manual_seed(seed)).payload


def _flip(data: bytes, rng: random.Random, flips: int = 3) -> bytes:
    buffer = bytearray(data)
    for _ in range(flips):
        if buffer:
            buffer[rng.randrange(len(buffer))] ^= 1 << rng.randrange(8)
    return bytes(buffer)


# -- data-socket mutations ------------------------------------------------------------------

def _data_random(rng: random.Random) -> Frames:
    return [rng.randbytes(rng.randint(0, 200)) for _ in range(rng.randint(1, 4))]


def _data_truncated(rng: random.Random) -> Frames:
    header, frames = _forward(rng)
    index = rng.randrange(len(frames))
    frames[index] = frames[index][:rng.randrange(len(frames[index]))]
    return [_pack(header), *frames]


def _data_lying_shape(rng: random.Random) -> Frames:
    header, frames = _forward(rng)
    spec = header["tensors"][0]
    spec["shape"] = [BATCH, SEQ, DIM + rng.randint(1, 64)] if rng.random() < 0.5 else [rng.randint(0, 9)] * 3
    return [_pack(header), *frames]


def _data_huge(rng: random.Random) -> Frames:
    header, frames = _forward(rng)
    spec = header["tensors"][0]
    spec["shape"] = [1 << rng.randint(31, 40), 2]
    spec["nbytes"] = spec["shape"][0] * 8
    return [_pack(header), *frames]


def _data_wrong_run_or_version(rng: random.Random) -> Frames:
    header, frames = _forward(rng)
    if rng.random() < 0.5:
        header["run_id"] = rng.choice(["other", "", "default ", "x" * 100])
    else:
        header["version"] = rng.choice([0, 2, 99, -1, 2**40])
    return [_pack(header), *frames]


def _data_header_mutation(rng: random.Random) -> Frames:
    header, frames = _forward(rng)
    choice = rng.randrange(6)
    if choice == 0:
        return [_flip(_pack(header), rng, rng.randint(1, 8)), *frames]
    if choice == 1:
        header["tensors"][1]["dtype"] = rng.choice(["float64", "object", "", "complex64"])
    elif choice == 2:
        header["kind"] = rng.choice(["forwardx", "snapshot_push", "error", "bootstrap_reply", "probe"])
    elif choice == 3:
        header[rng.choice(["evil", "tensors2"])] = 1
    elif choice == 4:
        frames.append(b"extra")
    else:
        header["microbatch_id"] = "not an int"
    return [_pack(header), *frames]


def _data_bad_packing(rng: random.Random) -> Frames:
    """A forward in a wire dtype (pipeline.wire_dtype) whose packing does not hold together:
    int8 or int4 codes (two a byte) without their scales, scales of the wrong shape, or the
    frames out of order."""
    acts = torch.randint(-127, 128, (BATCH, SEQ, DIM), dtype=torch.int8) if rng.random() < 0.5 else \
        torch.randint(0, 256, (BATCH, SEQ, DIM // 2), dtype=torch.uint8)
    scales = torch.rand(BATCH, SEQ, 1)
    targets = torch.randint(0, 256, (BATCH, SEQ))
    choice = rng.randrange(4)
    if choice == 1:
        scales = torch.rand(BATCH, SEQ, rng.randint(2, 4))
    tensors = {0: [acts, targets], 1: [acts, scales, targets], 2: [scales, acts, targets],
               3: [acts.to(torch.bfloat16), scales, targets]}[choice]
    specs = [{"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."),
              "nbytes": t.numel() * t.element_size()} for t in tensors]
    return [_pack(_header(tensors=specs, extra={"reply_to": "tcp://127.0.0.1:1"})),
            *(t.contiguous().view(torch.uint8).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes()
              for t in tensors)]


DATA_MUTATIONS: list[Callable[[random.Random], Frames]] = [
    _data_random, _data_truncated, _data_lying_shape, _data_huge, _data_wrong_run_or_version, _data_header_mutation,
    _data_bad_packing]


# -- exchange-socket mutations ----------------------------------------------------------------

def _ex_zstd_bomb(rng: random.Random) -> Frames:
    return snapshot_push(rng.choice(_zstd_bombs()))


def _ex_non_finite(rng: random.Random) -> Frames:
    return snapshot_push(_honest_payload(nan=True))


def _ex_snapshot_mutation(rng: random.Random) -> Frames:
    codec = rng.choice(FUZZ_CODECS)
    payload = _honest_payload(codec=codec, seed=rng.getrandbits(63))
    request = functools.partial(snapshot_push, codec=codec)
    choice = rng.randrange(9)
    if choice == 0:
        return request(_flip(payload, rng), digest=checksum(payload))  # checksum
    if choice == 1:
        return request(_flip(payload, rng))  # right checksum, damaged zstd: codec
    if choice == 2:
        return request(payload[:rng.randrange(len(payload))])
    if choice == 3:
        specs = [[[count], "float32"] for _, _, count in _whole_pieces()]
        specs[rng.randrange(len(specs))][0] = [rng.randint(1, 10**6)]
        return request(payload, specs=specs)
    if choice == 7:  # a chunk that lies about its place in the snapshot: malformed_chunk
        pieces = _whole_pieces()
        lie = rng.randrange(4)
        if lie == 0:
            pieces[rng.randrange(len(pieces))][2] += rng.randint(1, 10**6)
        elif lie == 1:
            pieces[0][0] = rng.choice([-1, len(pieces) + rng.randrange(5), True])
        return request(payload, pieces=pieces if lie < 2 else None,
                       chunk=[(0, 1), (3, 2), (0, 1 << 20), None][lie])
    if choice == 4:
        return request(payload, specs=[["x", None]] if rng.random() < 0.5 else "junk")
    if choice == 5:
        return request(payload, parts=rng.choice(["slow+momentum", "everything", ""]))
    if choice == 6:
        return request(payload, stage=rng.choice([0, 7, -1]))
    claimed = [c for c in ("lz4", "raw", "bf16-shuffle-zstd", *FUZZ_CODECS) if c != codec]
    return snapshot_push(payload, codec=rng.choice(claimed))


def _ex_bad_quantised_body(rng: random.Random) -> Frames:
    """A quantised snapshot, re-framed honestly (right checksum) with a bad scale or code."""
    codec = rng.choice(FUZZ_CODECS[1:])
    body = bytearray(zstandard.ZstdDecompressor().decompress(_honest_payload(codec=codec, seed=rng.getrandbits(63))))
    first = stage_shapes()[0]
    scale_bytes = 4 * math.ceil(math.prod(first) / 64)  # the first tensor's scales, then its codes
    if rng.random() < 0.5:
        at = 4 * rng.randrange(scale_bytes // 4)
        body[at:at + 4] = struct.pack("<f", rng.choice([math.nan, math.inf, -math.inf, -1.0, -1e-30]))
    else:
        at = scale_bytes + rng.randrange(math.prod(first) // 4)
        # code -128, nibble 0 (code -8), or the 2-bit value 3 (no code)
        body[at] = {"int8-zstd": 0x80, "int4-zstd": body[at] & 0xF0, "int2-zstd": body[at] | 0x03}[codec]
    return snapshot_push(zstandard.ZstdCompressor(write_checksum=True).compress(bytes(body)), codec=codec)


SPARSE_FAULTS = ("index_outside_chunk", "index_repeated", "index_falls", "padding_bits", "bad_scale", "oversized")


def bad_sparse_push(fault: str, rng: random.Random) -> Frames:
    """An outer gradient pushed with a sparse codec (topk2-zstd / topk4-zstd), re-framed
    honestly (right checksum, right zstd frame) around a body with one `fault` of
    SPARSE_FAULTS: the codec refuses each ("codec"); "oversized" declares a tensor larger
    than the stage's ("shape_mismatch")."""
    codec = rng.choice(("topk2-zstd", "topk4-zstd"))
    tensors = [torch.randn(s) for s in stage_shapes()]
    payload = encode_tensors(tensors, codec).payload
    if fault == "oversized":
        specs = [[[count], "float32"] for _, _, count in _whole_pieces()]
        specs[rng.randrange(len(specs))][0] = [rng.randint(1 << 20, 1 << 30)]
        return snapshot_push(payload, specs=specs, codec=codec, parts="grad")
    body = bytearray(zstandard.ZstdDecompressor().decompress(payload))
    # The tensor to damage: the first one keeping at least two entries (one with padding bits
    # for that fault); its chunk starts after the chunks of the tensors before it.
    per_byte = 8 // (2 if codec == "topk2-zstd" else 4)
    shapes = stage_shapes()
    wanted = (lambda kept: kept % per_byte != 0) if fault == "padding_bits" else (lambda kept: kept >= 2)
    target = next(i for i, shape in enumerate(shapes) if wanted(kept_count(math.prod(shape))))
    start = sum(codec_named(codec).body_bytes(TensorSpec(shape, "float32")) for shape in shapes[:target])
    chunks, kept = sparse_layout(math.prod(shapes[target]))
    indices = start + 4 * chunks  # its scales, then the high bytes of its indices, then the low bytes
    if fault == "index_outside_chunk":
        body[indices + rng.randrange(kept)] = 0xFF  # high byte 0xFF: index >= 65280
    elif fault in ("index_repeated", "index_falls"):
        at = rng.randrange(min(kept, 64) - 1)  # two indices of the first chunk
        for plane in (indices, indices + kept):
            if fault == "index_repeated":
                body[plane + at + 1] = body[plane + at]
            else:
                body[plane + at], body[plane + at + 1] = body[plane + at + 1], body[plane + at]
    elif fault == "padding_bits":
        body[indices + 2 * kept + kept // per_byte] |= 0x80
    else:
        at = start + 4 * rng.randrange(chunks)
        body[at:at + 4] = struct.pack("<f", rng.choice([math.nan, math.inf, -1.0]))
    return snapshot_push(zstandard.ZstdCompressor(write_checksum=True).compress(bytes(body)), codec=codec,
                          parts="grad")


def _ex_bad_sparse_body(rng: random.Random) -> Frames:
    return bad_sparse_push(rng.choice(SPARSE_FAULTS), rng)


def _ex_wrong_codec(rng: random.Random) -> Frames:
    """Δ alone with a dense codec, or a whole state with a sparse one: wrong_codec."""
    if rng.random() < 0.5:
        return snapshot_push(_honest_payload(), parts="grad")
    codec = rng.choice(("topk2-zstd", "topk4-zstd"))
    return snapshot_push(encode_tensors([torch.randn(s) for s in stage_shapes()], codec).payload, codec=codec)


def _ex_wire(rng: random.Random) -> Frames:
    frames = rng.choice(DATA_MUTATIONS)(rng)
    if rng.random() < 0.2:  # well formed, but not a kind the exchange server answers
        return [_pack(_header(rng.choice(["forward", "backward", "error", "snapshot_ack", "outer_verdict"]),
                              stage=TARGET_STAGE))]
    if rng.random() < 0.1:  # a question about a lost acknowledgement, for no step at all
        return [_pack(_header("outer_confirm", stage=TARGET_STAGE, outer_step=-rng.randrange(1, 1 << 20)))]
    if rng.random() < 0.3:
        header = _header("snapshot_push", stage=TARGET_STAGE,
                         tensors=[{"shape": [1 << 40], "dtype": "uint8", "nbytes": 1 << 40}])
        frames = [_pack(header), b"tiny"]
    return frames


EXCHANGE_MUTATIONS: list[Callable[[random.Random], Frames]] = [
    _ex_zstd_bomb, _ex_non_finite, _ex_snapshot_mutation, _ex_bad_quantised_body, _ex_bad_sparse_body,
    _ex_wrong_codec, _ex_wire, _data_random]
