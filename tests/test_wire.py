from __future__ import annotations

import msgpack
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from noloco_rt.wire import (
    PROTOCOL_VERSION,
    Header,
    MessageKind,
    RejectCounter,
    RejectReason,
    WireLimits,
    WireReject,
    decode_message,
    encode_message,
    safe_decode,
)

RUN = "run-1"


def message(tensors=None, **overrides):
    tensors = [torch.randn(2, 3), torch.arange(4)] if tensors is None else tensors
    specs = [{"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."),
              "nbytes": t.numel() * t.element_size()} for t in tensors]
    fields = dict(version=PROTOCOL_VERSION, run_id=RUN, kind=MessageKind.FORWARD, sender="w1", microbatch_id=7,
                  attempt=1, stage=0, tensors=specs, extra={"reply_to": "tcp://127.0.0.1:5"})
    fields.update(overrides)
    return encode_message(Header(**fields), [t.numpy().tobytes() for t in tensors])


def raw_header(fields, frames=()):
    return [msgpack.packb(fields, use_bin_type=True), *frames]


def reason_of(parts, limits=None):
    with pytest.raises(WireReject) as info:
        decode_message(parts, expected_run_id=RUN, limits=limits or WireLimits())
    return info.value.reason


def test_round_trip():
    tensors = [torch.randn(2, 3), torch.arange(4), torch.zeros(0)]
    decoded = decode_message(message(tensors), expected_run_id=RUN)
    assert decoded.header.microbatch_id == 7 and decoded.header.extra["reply_to"] == "tcp://127.0.0.1:5"
    for got, want in zip(decoded.tensors, tensors, strict=True):
        assert torch.equal(got, want)
    decoded.tensors[0].add_(1)  # received tensors are owned and writable


def test_malformed_header():
    assert reason_of([b"\xc1garbage"]) == RejectReason.MALFORMED_HEADER
    assert reason_of([msgpack.packb([1, 2])]) == RejectReason.MALFORMED_HEADER
    assert reason_of([]) == RejectReason.MALFORMED_HEADER
    assert reason_of(raw_header({"version": 1, "run_id": RUN})) == RejectReason.MALFORMED_HEADER  # no kind
    assert reason_of(raw_header({"version": 1, "run_id": RUN, "kind": "forward", "sender": "x",
                                 "attempt": "one"})) == RejectReason.MALFORMED_HEADER


def test_header_too_large():
    assert reason_of(message(), WireLimits(max_header_bytes=10)) == RejectReason.HEADER_TOO_LARGE


def test_unknown_version():
    assert reason_of(message(version=99)) == RejectReason.UNKNOWN_VERSION


def test_wrong_run():
    assert reason_of(message(run_id="another-run")) == RejectReason.WRONG_RUN


def test_unknown_kind():
    assert reason_of(message(kind="teleport")) == RejectReason.UNKNOWN_KIND


def test_too_many_frames():
    assert reason_of(message(), WireLimits(max_frames=1)) == RejectReason.TOO_MANY_FRAMES


def test_frame_count_mismatch():
    assert reason_of(message()[:-1]) == RejectReason.FRAME_COUNT_MISMATCH


def test_dtype_not_allowed():
    parts = message([torch.zeros(2)])
    header = msgpack.unpackb(parts[0])
    header["tensors"][0]["dtype"] = "complex64"
    assert reason_of(raw_header(header, parts[1:])) == RejectReason.DTYPE_NOT_ALLOWED


def test_lying_shape():
    parts = message([torch.zeros(2, 3)])
    header = msgpack.unpackb(parts[0])
    header["tensors"][0]["shape"] = [3, 3]
    assert reason_of(raw_header(header, parts[1:])) == RejectReason.SHAPE_BYTES_MISMATCH
    header["tensors"][0]["shape"] = [2, 3]
    assert reason_of(raw_header(header, [b"\0" * 5])) == RejectReason.SHAPE_BYTES_MISMATCH


def test_frame_too_large_and_huge_declared_sizes():
    assert reason_of(message([torch.zeros(100)]), WireLimits(max_frame_bytes=100)) == RejectReason.FRAME_TOO_LARGE
    parts = message([torch.zeros(2)])
    header = msgpack.unpackb(parts[0])
    header["tensors"][0].update(shape=[1 << 40], nbytes=4 << 40)  # 4 TiB declared, 8 bytes sent
    assert reason_of(raw_header(header, parts[1:])) == RejectReason.FRAME_TOO_LARGE


def test_message_too_large():
    parts = message([torch.zeros(100), torch.zeros(100)])
    assert reason_of(parts, WireLimits(max_message_bytes=500)) == RejectReason.MESSAGE_TOO_LARGE


def test_non_finite():
    assert reason_of(message([torch.tensor([1.0, float("nan")])])) == RejectReason.NON_FINITE
    assert reason_of(message([torch.tensor([float("inf")])])) == RejectReason.NON_FINITE
    decoded = decode_message(message([torch.tensor([float("nan")])]), expected_run_id=RUN, check_finite=False)
    assert decoded.tensors[0].isnan().all()


def test_every_reason_has_a_test():
    tested = {RejectReason.MALFORMED_HEADER, RejectReason.HEADER_TOO_LARGE, RejectReason.UNKNOWN_VERSION,
              RejectReason.WRONG_RUN, RejectReason.UNKNOWN_KIND, RejectReason.TOO_MANY_FRAMES,
              RejectReason.FRAME_COUNT_MISMATCH, RejectReason.DTYPE_NOT_ALLOWED, RejectReason.SHAPE_BYTES_MISMATCH,
              RejectReason.FRAME_TOO_LARGE, RejectReason.MESSAGE_TOO_LARGE, RejectReason.NON_FINITE}
    assert tested == set(RejectReason)


def _mutate(parts: list[bytes], data) -> list[bytes]:
    parts = [bytes(p) for p in parts]
    action = data.draw(st.sampled_from(["flip", "truncate", "drop", "swap", "extend", "header_field"]))
    index = data.draw(st.integers(0, len(parts) - 1))
    if action == "flip" and parts[index]:
        position = data.draw(st.integers(0, len(parts[index]) - 1))
        buffer = bytearray(parts[index])
        buffer[position] ^= 1 << data.draw(st.integers(0, 7))
        parts[index] = bytes(buffer)
    elif action == "truncate":
        parts[index] = parts[index][: data.draw(st.integers(0, len(parts[index])))]
    elif action == "drop":
        del parts[index]
    elif action == "swap" and len(parts) > 2:
        parts[1], parts[2] = parts[2], parts[1]
    elif action == "extend":
        parts.append(data.draw(st.binary(max_size=64)))
    elif action == "header_field":
        header = msgpack.unpackb(parts[0])
        key = data.draw(st.sampled_from(sorted(header)))
        header[key] = data.draw(st.one_of(st.integers(-2**63, 2**63 - 1), st.text(max_size=8), st.none(),
                                          st.lists(st.integers(-5, 5), max_size=3), st.binary(max_size=8)))
        parts[0] = msgpack.packb(header, use_bin_type=True)
    return parts


@given(data=st.data())
def test_fuzz_mutated_messages_never_raise(data):
    counter = RejectCounter()
    parts = _mutate(message(), data)
    result = safe_decode(parts, expected_run_id=RUN, counter=counter)
    assert (result is None) == (sum(counter.values()) == 1)


@given(parts=st.lists(st.binary(max_size=200), max_size=5))
def test_fuzz_random_bytes_never_raise(parts):
    counter = RejectCounter()
    assert safe_decode(parts, expected_run_id=RUN, counter=counter) is None or not parts
    assert sum(counter.values()) <= 1


def test_zero_copy_decode_views_the_frame():
    frame = torch.arange(6, dtype=torch.float32).numpy().tobytes()
    header = message([torch.zeros(6)])[0]
    decoded = decode_message([header, frame], expected_run_id=RUN, copy=False)
    assert torch.equal(decoded.tensors[0], torch.arange(6, dtype=torch.float32))
