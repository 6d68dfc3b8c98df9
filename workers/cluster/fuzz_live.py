"""Fuzzing a live worker: random and mutated messages on its data and exchange sockets.

Each message is built to be invalid, and the reason the worker must give is predicted
beforehand by running the worker's own validation on it locally (noloco_rt.net.messages.decode
for the data path, a SnapshotService.handle for the exchange path); a message the local
check would accept is not sent. The worker's Prometheus rejected counters must then
grow by exactly the predicted counts per reason, and the exchange server must answer
every request with an ERROR. Used by tests/test_fuzz_live.py (a small count) and
benchmarks/fuzz_live.py (10,000 messages).
"""

from __future__ import annotations

import collections
import functools
import math
import random
import re
import struct
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import torch
import zmq
import zstandard

from noloco_rt.config import load_config
from noloco_rt.model import build_stage
from noloco_rt.net import messages
from noloco_rt.net.wire import PROTOCOL_VERSION, MessageKind, WireReject
from noloco_rt.outer.codec import checksum, encode_tensors
from workers.cluster.local_cluster import LocalCluster, WorkerProcess
from workers.metrics import WorkerMetrics
from workers.outer.service import SnapshotService

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
def _stage_shapes() -> list[tuple[int, ...]]:
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


def _whole_pieces() -> list[list[int]]:
    """A one-chunk push: every tensor whole, as its 1-D piece."""
    return [[i, 0, math.prod(s)] for i, s in enumerate(_stage_shapes())]


def _snapshot_push(payload: bytes, *, specs: list | None = None, digest: str | None = None,
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
FUZZ_CODECS = ("shuffle-zstd", "int8-zstd", "int4-zstd")


def _honest_payload(scale: float = 1.0, nan: bool = False, codec: str = "shuffle-zstd", seed: int = 0) -> bytes:
    tensors = [torch.randn(s) * scale for s in _stage_shapes()]
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
        header["kind"] = rng.choice(["forwardx", "snapshot_push", "error", "bootstrap_reply"])
    elif choice == 3:
        header[rng.choice(["evil", "tensors2"])] = 1
    elif choice == 4:
        frames.append(b"extra")
    else:
        header["microbatch_id"] = "not an int"
    return [_pack(header), *frames]


def _data_bad_packing(rng: random.Random) -> Frames:
    """A forward in a wire dtype (pipeline.wire_dtype) whose packing does not hold together:
    int8 codes without their scales, scales of the wrong shape, or the frames out of order."""
    acts = torch.randint(-127, 128, (BATCH, SEQ, DIM), dtype=torch.int8)
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
    return _snapshot_push(rng.choice(_zstd_bombs()))


def _ex_non_finite(rng: random.Random) -> Frames:
    return _snapshot_push(_honest_payload(nan=True))


def _ex_snapshot_mutation(rng: random.Random) -> Frames:
    codec = rng.choice(FUZZ_CODECS)
    payload = _honest_payload(codec=codec, seed=rng.getrandbits(63))
    request = functools.partial(_snapshot_push, codec=codec)
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
    return _snapshot_push(payload, codec=rng.choice(claimed))


def _ex_bad_quantised_body(rng: random.Random) -> Frames:
    """A quantised snapshot, re-framed honestly (right checksum) with a bad scale or code."""
    codec = rng.choice(FUZZ_CODECS[1:])
    body = bytearray(zstandard.ZstdDecompressor().decompress(_honest_payload(codec=codec, seed=rng.getrandbits(63))))
    first = _stage_shapes()[0]
    scale_bytes = 4 * math.ceil(math.prod(first) / 64)  # the first tensor's scales, then its codes
    if rng.random() < 0.5:
        at = 4 * rng.randrange(scale_bytes // 4)
        body[at:at + 4] = struct.pack("<f", rng.choice([math.nan, math.inf, -math.inf, -1.0, -1e-30]))
    else:
        at = scale_bytes + rng.randrange(math.prod(first) // 2)
        body[at] = 0x80 if codec == "int8-zstd" else body[at] & 0xF0  # code -128, or nibble 0 (code -8)
    return _snapshot_push(zstandard.ZstdCompressor(write_checksum=True).compress(bytes(body)), codec=codec)


def _ex_wire(rng: random.Random) -> Frames:
    frames = rng.choice(DATA_MUTATIONS)(rng)
    if rng.random() < 0.2:  # well formed, but not a kind the exchange server answers
        return [_pack(_header(rng.choice(["forward", "backward", "error", "snapshot_ack"]), stage=TARGET_STAGE))]
    if rng.random() < 0.3:
        header = _header("snapshot_push", stage=TARGET_STAGE,
                         tensors=[{"shape": [1 << 40], "dtype": "uint8", "nbytes": 1 << 40}])
        frames = [_pack(header), b"tiny"]
    return frames


EXCHANGE_MUTATIONS: list[Callable[[random.Random], Frames]] = [
    _ex_zstd_bomb, _ex_non_finite, _ex_snapshot_mutation, _ex_bad_quantised_body, _ex_wire, _data_random]


# -- prediction: the worker's own checks, run locally -----------------------------------------

class _QuietLog:
    def info(self, *_: Any, **__: Any) -> None: ...

    def warning(self, *_: Any, **__: Any) -> None: ...


def predict_data(frames: Frames) -> str | None:
    """The reason the worker's data path rejects these frames with, or None if it would accept."""
    try:
        messages.decode(list(frames), run_id=RUN_ID)
    except WireReject as reject:
        return reject.reason.value
    return None


class ExchangePredictor:
    """A SnapshotService like the worker's, answering locally."""

    def __init__(self) -> None:
        cfg = load_config(environ={}, overrides=[{"pipeline": {"stages": 2}}])
        self.service = SnapshotService(cfg, TARGET_STAGE, "predictor", metrics=WorkerMetrics(), log=_QuietLog(),
                                       expected_shapes=_stage_shapes())

    def predict(self, frames: Frames) -> str | None:
        before = dict(self.service.rejects)
        self.service.handle([zmq.Frame(f) for f in frames])
        after = self.service.rejects
        changed = [k for k in after if after[k] != before.get(k, 0)]
        self.service.inbox.clear()  # a predicted-valid one would sit there
        self.service.assemblies.clear()
        return changed[0] if changed else None


# -- the run ----------------------------------------------------------------------------------

@dataclass
class FuzzReport:
    sent: collections.Counter = field(default_factory=collections.Counter)
    """Expected rejections by reason (what was sent)."""
    counted: dict[str, float] = field(default_factory=dict)
    """Growth of the worker's rejected counters by reason."""
    sent_data: int = 0
    sent_exchange: int = 0
    error_replies: int = 0
    missing_replies: int = 0
    skipped_valid: int = 0
    rss_before_kb: int = 0
    rss_after_kb: int = 0
    inner_before: int = 0
    inner_after_fuzz: int = 0
    seconds: float = 0.0


def rejected_counters(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    pattern = r'^noloco_messages_rejected_total\{reason="([^"]+)"\} (\S+)$'
    return {m.group(1): float(m.group(2)) for m in re.finditer(pattern, text, re.MULTILINE)}


def vm_rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def start_target(cluster: LocalCluster) -> WorkerProcess:
    """A 2-stage pipeline of one worker each; the stage-1 worker is the target."""
    cluster.start_worker(0, "feeder")
    target = cluster.start_worker(1, "target")
    cluster.wait_online(2)
    cluster.wait_event(target, "train_progress", timeout_s=60)
    return target


def fuzz(cluster: LocalCluster, target: WorkerProcess, *, count: int, seed: int = 0,
         reply_timeout_s: float = 5.0) -> FuzzReport:
    """Send `count` invalid messages (half to each socket) and collect the figures."""
    rng = random.Random(seed)
    started = target.events("worker_started")[0]
    port = cluster.wait_event(target, "metrics_serving", timeout_s=30)["port"]
    report = FuzzReport(inner_before=target.latest_inner_step(), rss_before_kb=vm_rss_kb(target.process.pid))
    baseline = rejected_counters(port)
    predictor = ExchangePredictor()
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.setsockopt(zmq.SNDTIMEO, 10_000)  # a full queue blocks (no silent drop), but not forever
    push.connect(started["data_addr"])
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(started["exchange_addr"])
    began = time.monotonic()
    try:
        for index in range(count):
            to_data = index % 2 == 0
            for _ in range(20):  # bounded: regenerate the rare mutation that stays valid
                frames = rng.choice(DATA_MUTATIONS if to_data else EXCHANGE_MUTATIONS)(rng)
                reason = predict_data(frames) if to_data else predictor.predict(frames)
                if reason is not None:
                    break
                report.skipped_valid += 1
            else:
                continue
            report.sent[reason] += 1
            if to_data:
                push.send_multipart(frames)
                report.sent_data += 1
                continue
            dealer.send_multipart(frames)
            report.sent_exchange += 1
            if not dealer.poll(int(reply_timeout_s * 1000), zmq.POLLIN):
                report.missing_replies += 1
                continue
            reply = dealer.recv_multipart()
            kind = msgpack.unpackb(reply[0], raw=False).get("kind")
            report.error_replies += kind == MessageKind.ERROR.value
    finally:
        push.close()
        dealer.close()
        ctx.term()
    report.seconds = time.monotonic() - began
    expected_total = sum(report.sent.values())

    def delta() -> dict[str, float]:
        now = rejected_counters(port)
        return {k: v - baseline.get(k, 0.0) for k, v in now.items() if v - baseline.get(k, 0.0)}

    # The data socket may still hold queued messages: wait (bounded) for the counts to settle.
    try:
        cluster.wait_for(lambda: sum(delta().values()) >= expected_total, timeout_s=30,
                         what="the worker to count every fuzz message")
    except AssertionError:
        pass  # the caller compares what was counted with what was sent
    report.counted = delta()
    report.inner_after_fuzz = target.latest_inner_step()
    report.rss_after_kb = vm_rss_kb(target.process.pid)
    return report
