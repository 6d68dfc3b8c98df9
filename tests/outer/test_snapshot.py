"""The snapshot format and its validation (noloco_rt.outer.snapshot): exact cases, no sockets."""

from __future__ import annotations

import struct

import msgpack
import pytest
import torch
import zstandard

from noloco_rt.net.wire import MessageKind
from noloco_rt.outer.codec import checksum
from noloco_rt.outer.formula import PeerOuterState
from noloco_rt.outer.snapshot import (
    DECOMPRESSED_SLACK_BYTES,
    PAYLOAD_SLACK_BYTES,
    PartsKind,
    SnapshotReader,
    SnapshotRejected,
    contribution_parts,
    encode_snapshot,
    max_decompressed_bytes,
    require_kind,
    snapshot_message,
)

RUN = "r"
SHAPES = [(4, 3), (5,)]


def _weights(seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen) for s in SHAPES]


def _frames(tensors, parts: PartsKind, *, codec: str = "shuffle-zstd", kind=MessageKind.SNAPSHOT_PUSH,
            counters=None, step: int = 3) -> list:
    snapshot = encode_snapshot(tensors, codec, step, parts, counters)
    return snapshot_message(kind, run_id=RUN, stage=1, sender="peer", snapshot=snapshot)


def _tamper(frames: list, **extra) -> list:
    """The same message with header.extra fields replaced."""
    header = msgpack.unpackb(bytes(frames[0]), raw=False)
    header["extra"].update(extra)
    return [msgpack.packb(header, use_bin_type=True), *frames[1:]]


def _with_payload(frames: list, payload: bytes) -> list:
    header = msgpack.unpackb(bytes(frames[0]), raw=False)
    header["tensors"] = [{"shape": [len(payload)], "dtype": "uint8", "nbytes": len(payload)}]
    header["extra"]["checksum"] = checksum(payload)
    return [msgpack.packb(header, use_bin_type=True), payload]


def _reason(reader: SnapshotReader, frames: list, read=SnapshotReader.contribution) -> str:
    with pytest.raises(SnapshotRejected) as info:
        read(reader, reader.message(frames))
    return info.value.reason


@pytest.fixture
def reader() -> SnapshotReader:
    return SnapshotReader(RUN, SHAPES)


@pytest.mark.parametrize("codec", ["raw", "zstd", "shuffle-zstd"])
def test_fast_contribution_round_trips_exactly(reader, codec):
    fast = _weights()
    snapshot, state = reader.contribution(reader.message(_frames(fast, PartsKind.FAST, codec=codec)))
    assert snapshot.outer_step == 3 and snapshot.parts_kind == "fast" and state.slow is None
    assert all(torch.equal(a, b) for a, b in zip(state.fast, fast, strict=True))


def test_slow_grad_contribution_round_trips_into_slow_and_outer_grad(reader):
    slow, grad = _weights(1), _weights(2)
    parts, kind = contribution_parts(PeerOuterState(slow=slow, outer_grad=grad))
    assert kind is PartsKind.SLOW_GRAD and len(parts) == 4
    _, state = reader.contribution(reader.message(_frames(parts, kind)))
    assert all(torch.equal(a, b) for a, b in zip(state.slow, slow, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(state.outer_grad, grad, strict=True))


def test_bootstrap_round_trips_with_counters(reader):
    slow, momentum = _weights(1), _weights(2)
    frames = _frames(slow + momentum, PartsKind.SLOW_MOMENTUM, kind=MessageKind.BOOTSTRAP_REPLY,
                     counters={"inner_steps": 7, "outer_steps": 2})
    decoded = reader.message(frames)
    require_kind(decoded, MessageKind.BOOTSTRAP_REPLY)
    snapshot, tensors = reader.bootstrap(decoded)
    assert snapshot.counters == {"inner_steps": 7, "outer_steps": 2}
    assert all(torch.equal(a, b) for a, b in zip(tensors, slow + momentum, strict=True))
    assert snapshot.digest == checksum(snapshot.encoded.payload)


@pytest.mark.parametrize(("counters", "reason"), [
    ({"inner_steps": -5}, "malformed_counters"), ({"outer_steps": 10**18}, "malformed_counters"),
    ({"clock": 3}, "malformed_counters"),
    # not a map of names to ints: the header's own check refuses it (noloco_rt/net/header_extra.py)
    ({"inner_steps": "x"}, "malformed_header"), ({"inner_steps": True}, "malformed_header"),
    ([1, 2], "malformed_header"), ({"outer_steps": 2.5}, "malformed_header")])
def test_a_bootstrap_with_malformed_counters_is_refused_not_adopted(reader, counters, reason):
    # A joiner adopts a donor's counters as its own step counts: "x" once crashed it past the
    # reader, and -5 or 10**18 were taken as they came.
    frames = _frames(_weights(1) + _weights(2), PartsKind.SLOW_MOMENTUM, kind=MessageKind.BOOTSTRAP_REPLY,
                     counters={"inner_steps": 7, "outer_steps": 2})
    assert reader.bootstrap(reader.message(frames))[0].counters == {"inner_steps": 7, "outer_steps": 2}
    with pytest.raises(SnapshotRejected) as info:
        reader.bootstrap(reader.message(_tamper(frames, counters=counters)))
    assert info.value.reason == reason


@pytest.mark.parametrize(("codec", "max_code"), [("int8-zstd", 127), ("int4-zstd", 7)])
def test_quantised_contributions_are_accepted_within_their_bound(reader, codec, max_code):
    slow, grad = _weights(1), [0.01 * t for t in _weights(2)]
    for parts, kind in (contribution_parts(PeerOuterState(fast=_weights())),
                        contribution_parts(PeerOuterState(slow=slow, outer_grad=grad))):
        snapshot, state = reader.contribution(reader.message(_frames(parts, kind, codec=codec)))
        assert snapshot.encoded.codec == codec
        got = state.fast if kind is PartsKind.FAST else state.slow + state.outer_grad
        for decoded, sent in zip(got, parts, strict=True):  # every tensor here is one block
            assert decoded.shape == sent.shape
            assert float((decoded - sent).abs().max()) <= float(sent.abs().max()) / max_code * (1 + 2**-16)


@pytest.mark.parametrize("codec", ["int8-zstd", "int4-zstd"])
@pytest.mark.parametrize("scale", [float("nan"), -0.5])
def test_a_quantised_snapshot_with_a_corrupted_scale_is_refused(reader, codec, scale):
    frames = _frames(_weights(), PartsKind.FAST, codec=codec)
    body = bytearray(zstandard.ZstdDecompressor().decompress(bytes(frames[1])))

    def with_first_scale(value: float) -> list:  # the scale of the first tensor's only block
        body[0:4] = struct.pack("<f", value)
        return _with_payload(frames, zstandard.ZstdCompressor(write_checksum=True).compress(bytes(body)))

    reader.contribution(reader.message(with_first_scale(0.5)))  # re-framing alone is accepted
    assert _reason(reader, with_first_scale(scale)) == "codec"  # checksum right, scale wrong


def test_wire_rejects_keep_the_wire_reason(reader):
    other_run = snapshot_message(MessageKind.SNAPSHOT_PUSH, run_id="other", stage=1, sender="x")
    with pytest.raises(SnapshotRejected) as info:
        reader.message(other_run)
    assert info.value.reason == "wrong_run"


def test_a_reply_of_another_kind_holds_no_snapshot(reader):
    error = reader.message(snapshot_message(MessageKind.ERROR, run_id=RUN, stage=1, sender="x"))
    assert error.header.outer_step == -1
    with pytest.raises(SnapshotRejected) as info:
        require_kind(error, MessageKind.SNAPSHOT_ACK)
    assert info.value.reason == "no_snapshot"


def test_empty_snapshot(reader):
    assert _reason(reader, snapshot_message(MessageKind.SNAPSHOT_PUSH, run_id=RUN, stage=1, sender="x")) \
        == "empty_snapshot"


def test_checksum(reader):
    assert _reason(reader, _tamper(_frames(_weights(), PartsKind.FAST), checksum="0" * 16)) == "checksum"


def test_malformed_specs_are_a_malformed_header(reader):
    assert _reason(reader, _tamper(_frames(_weights(), PartsKind.FAST), specs=[[["a"], "float32"]])) \
        == "malformed_header"


def test_shape_mismatch_for_other_shapes_unknown_parts_or_the_wrong_copy_count(reader):
    frames = _frames(_weights(), PartsKind.FAST)
    assert _reason(reader, _tamper(frames, specs=[[[3, 4], "float32"], [[5], "float32"]])) == "shape_mismatch"
    assert _reason(reader, _tamper(frames, parts="weights")) == "shape_mismatch"
    assert _reason(reader, _tamper(frames, parts="slow+grad")) == "shape_mismatch"  # one copy, two expected


def test_wrong_parts_each_way(reader):
    momentum = _frames(_weights() + _weights(), PartsKind.SLOW_MOMENTUM)
    assert _reason(reader, momentum) == "wrong_parts"  # a bootstrap is not a contribution
    assert _reason(reader, _frames(_weights(), PartsKind.FAST), SnapshotReader.bootstrap) == "wrong_parts"


def test_codec_errors_and_decompression_bombs(reader):
    frames = _frames(_weights(), PartsKind.FAST, codec="zstd")
    assert _reason(reader, _with_payload(frames, b"not zstd at all")) == "codec"
    bomb = zstandard.ZstdCompressor(level=1).compress(bytes(max_decompressed_bytes(SHAPES) + 4096))
    assert _reason(reader, _with_payload(frames, bomb)) == "codec"


def test_non_finite(reader):
    poisoned = _weights()
    poisoned[1][2] = float("nan")
    assert _reason(reader, _frames(poisoned, PartsKind.FAST)) == "non_finite"


def test_payload_size_bound(reader):
    bound = max_decompressed_bytes(SHAPES)
    assert bound == 2 * 4 * (12 + 5) + DECOMPRESSED_SLACK_BYTES
    frames = _frames(_weights(), PartsKind.FAST, codec="zstd")
    # At the bound the payload is read (and fails later, as garbage); one byte more is refused unread.
    assert _reason(reader, _with_payload(frames, bytes(bound + PAYLOAD_SLACK_BYTES))) == "codec"
    assert _reason(reader, _with_payload(frames, bytes(bound + PAYLOAD_SLACK_BYTES + 1))) == "payload_too_large"


def test_a_contribution_needs_its_parts():
    with pytest.raises(ValueError):
        contribution_parts(PeerOuterState.__new__(PeerOuterState))
