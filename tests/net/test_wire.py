from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
import torch
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from noloco_rt.net.header_extra import HeaderExtra
from noloco_rt.net.wire import (
    PROTOCOL_VERSION,
    DecodedMessage,
    Header,
    MessageKind,
    RejectReason,
    WireLimits,
    WireReject,
    decode_message,
    encode_message,
)

RUN = "run-1"


def spec_of(tensor: torch.Tensor) -> dict[str, Any]:
    return {"shape": list(tensor.shape), "dtype": str(tensor.dtype).removeprefix("torch."),
            "nbytes": tensor.numel() * tensor.element_size()}


def frame_of(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""


def message(tensors: list[torch.Tensor] | None = None, **overrides: Any) -> list[Any]:
    tensors = [torch.randn(2, 3), torch.arange(4)] if tensors is None else tensors
    fields: dict[str, Any] = dict(
        version=PROTOCOL_VERSION, run_id=RUN, kind=MessageKind.FORWARD, sender="w1", microbatch_id=7,
        attempt=1, outer_step=3, stage=0, tensors=[spec_of(t) for t in tensors],
        extra=HeaderExtra(reply_to="tcp://127.0.0.1:5"))
    fields.update(overrides)
    return encode_message(Header(**fields), [frame_of(t) for t in tensors])


def header_of(parts: list[Any]) -> dict[str, Any]:
    return msgpack.unpackb(parts[0])


def with_header(header: dict[str, Any], frames: list[Any]) -> list[Any]:
    return [msgpack.packb(header, use_bin_type=True), *frames]


def reason_of(parts: Any, limits: WireLimits | None = None) -> RejectReason:
    with pytest.raises(WireReject) as info:
        decode_message(parts, expected_run_id=RUN, limits=limits)
    return info.value.reason


# -- happy path ---------------------------------------------------------------------------


def test_round_trip_of_several_tensors():
    tensors = [torch.randn(2, 3), torch.arange(4), torch.zeros(0, 5), torch.randn(4).bfloat16(),
               torch.randn(3).half(), torch.tensor([[1, -2]], dtype=torch.int32),
               torch.tensor([0, 255], dtype=torch.uint8)]
    decoded = decode_message(message(tensors), expected_run_id=RUN)
    header = decoded.header
    assert header.kind is MessageKind.FORWARD and header.sender == "w1"
    assert (header.microbatch_id, header.attempt, header.outer_step, header.stage) == (7, 1, 3, 0)
    assert header.extra == HeaderExtra(reply_to="tcp://127.0.0.1:5")
    assert len(decoded.tensors) == len(tensors)
    for got, want in zip(decoded.tensors, tensors, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)


def test_optional_fields_default_and_every_kind_decodes():
    for kind in MessageKind:
        parts = with_header({"version": PROTOCOL_VERSION, "run_id": RUN, "kind": kind.value, "sender": "s"}, [])
        header = decode_message(parts, expected_run_id=RUN).header
        assert header.kind is kind and header.tensors == [] and header.codec == "raw"


def test_copy_true_gives_owned_writable_tensors_without_warnings():
    frame = bytearray(frame_of(torch.arange(6, dtype=torch.float32)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        decoded = decode_message([message([torch.zeros(6)])[0], frame], expected_run_id=RUN)
        from_bytes = decode_message(message([torch.ones(6)]), expected_run_id=RUN)
    frame[:4] = b"\0\0\0\0"  # the sender's buffer changes afterwards
    assert torch.equal(decoded.tensors[0], torch.arange(6, dtype=torch.float32))
    from_bytes.tensors[0].add_(1)
    assert torch.equal(from_bytes.tensors[0], torch.full((6,), 2.0))


def test_copy_false_views_writable_frames_and_copies_read_only_ones():
    header = message([torch.zeros(6)])[0]
    zmq_frame = zmq.Frame(frame_of(torch.arange(6, dtype=torch.float32)))
    assert not memoryview(zmq_frame.buffer).readonly  # what a socket hands over with copy=False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns on read-only buffers: no such path is taken
        viewed = decode_message([header, zmq_frame], expected_run_id=RUN, copy=False).tensors[0]
        read_only = bytes(zmq_frame.bytes)
        copied = decode_message([header, read_only], expected_run_id=RUN, copy=False).tensors[0]
    assert torch.equal(viewed, torch.arange(6, dtype=torch.float32))
    memoryview(zmq_frame.buffer)[:4] = bytes(4)  # no copy: the tensor lives on the frame
    assert viewed[0] == 0.0 and viewed[1] == 1.0
    copied.add_(1)  # a private copy: the immutable bytes are untouched
    assert bytes(zmq_frame.bytes)[4:] == read_only[4:] and torch.equal(copied[1:], torch.arange(2, 7.0))


def test_encode_refuses_a_header_that_disagrees_with_its_frames():
    header = Header(version=PROTOCOL_VERSION, run_id=RUN, kind=MessageKind.BACKWARD, sender="s",
                    tensors=[spec_of(torch.zeros(1))])
    with pytest.raises(ValueError, match="1 tensors for 0 frames"):
        encode_message(header, [])


def test_limits_are_validated():
    with pytest.raises(ValueError, match="max_frames"):
        WireLimits(max_frames=0)
    with pytest.raises(ValueError, match="max_header_bytes"):
        WireLimits(max_header_bytes=True)


def test_finite_check_is_optional_and_ignores_integers():
    parts = message([torch.tensor([float("nan")]), torch.tensor([2**62])])
    decoded = decode_message(parts, expected_run_id=RUN, check_finite=False)
    assert decoded.tensors[0].isnan().all() and decoded.tensors[1].item() == 2**62
    assert decode_message(message([torch.arange(3)]), expected_run_id=RUN).tensors[0].tolist() == [0, 1, 2]


# -- one test per reject reason -----------------------------------------------------------


def edited(tensors: list[torch.Tensor], edit: Callable[[dict[str, Any]], None]) -> list[Any]:
    parts = message(tensors)
    header = header_of(parts)
    edit(header)
    return with_header(header, parts[1:])


def _lying_dtype(header: dict[str, Any]) -> None:
    header["tensors"][0]["dtype"] = "complex64"


def _lying_shape(header: dict[str, Any]) -> None:
    header["tensors"][0]["shape"] = [3, 3]  # 36 bytes declared by shape, 24 by nbytes


def _huge_declared_frame(header: dict[str, Any]) -> None:
    header["tensors"][0].update(shape=[1 << 40], nbytes=4 << 40)  # 4 TiB declared, 8 bytes sent


CASES: dict[RejectReason, Callable[[], tuple[list[Any], WireLimits | None]]] = {
    RejectReason.MALFORMED_HEADER: lambda: ([b"\xc1 is never valid msgpack"], None),
    RejectReason.HEADER_TOO_LARGE: lambda: (message(), WireLimits(max_header_bytes=10)),
    RejectReason.UNKNOWN_VERSION: lambda: (message(version=PROTOCOL_VERSION + 1), None),
    RejectReason.WRONG_RUN: lambda: (message(run_id="another-run"), None),
    RejectReason.UNKNOWN_KIND: lambda: (message(kind="teleport"), None),
    RejectReason.TOO_MANY_FRAMES: lambda: (message(), WireLimits(max_frames=1)),
    RejectReason.FRAME_COUNT_MISMATCH: lambda: (message()[:-1], None),
    RejectReason.DTYPE_NOT_ALLOWED: lambda: (edited([torch.zeros(2)], _lying_dtype), None),
    RejectReason.SHAPE_BYTES_MISMATCH: lambda: (edited([torch.zeros(2, 3)], _lying_shape), None),
    RejectReason.FRAME_TOO_LARGE: lambda: (edited([torch.zeros(2)], _huge_declared_frame), None),
    RejectReason.MESSAGE_TOO_LARGE: lambda: (message([torch.zeros(100), torch.zeros(100)]),
                                             WireLimits(max_message_bytes=500)),
    RejectReason.NON_FINITE: lambda: (message([torch.tensor([1.0, float("nan")])]), None),
    RejectReason.MALFORMED_FRAME: lambda: ([message([torch.zeros(4)])[0], memoryview(bytes(32))[::2]], None),
}


def test_every_reason_has_a_case():
    assert set(CASES) == set(RejectReason)


@pytest.mark.parametrize("reason", list(RejectReason), ids=str)
def test_each_reject_reason(reason):
    parts, limits = CASES[reason]()
    with pytest.raises(WireReject) as info:
        decode_message(parts, expected_run_id=RUN, limits=limits)
    assert info.value.reason is reason
    # Receivers count and log the reason's value; the message leads with it.
    assert str(info.value).split(":")[0] == reason.value


BASE = {"version": PROTOCOL_VERSION, "run_id": RUN, "kind": "forward", "sender": "x"}


@pytest.mark.parametrize("parts", [
    [],
    None,
    42,
    b"a bytes object is not a list of frames",
    [msgpack.packb([1, 2])],
    [msgpack.packb(BASE) + b"trailing"],
    [None],
    [msgpack.packb({k: v for k, v in BASE.items() if k != "kind"})],
    [msgpack.packb({**BASE, "attempt": "one"})],
    [msgpack.packb({**BASE, "stage": True})],
    [msgpack.packb({**BASE, "sender": b"bytes"})],
    [msgpack.packb({**BASE, "surprise": 1})],
    [msgpack.packb({**BASE, "tensors": {}})],
    [msgpack.packb({**BASE, "extra": []})],
    [msgpack.packb({**BASE, "extra": {"k": msgpack.ExtType(1, b"x")}})],
    [msgpack.packb({**BASE, "extra": {"surprise": 1}})],
    [msgpack.packb({**BASE, "extra": {"origin_step": True}})],
    [msgpack.packb({1: 2})],
    [b"\x91" * 5000],  # deeply nested arrays
    with_header({**BASE, "tensors": [{"shape": [1], "dtype": "float32"}]}, [bytes(4)]),
    with_header({**BASE, "tensors": [{"shape": [-1], "dtype": "float32", "nbytes": 4}]}, [bytes(4)]),
    with_header({**BASE, "tensors": [{"shape": [1] * 9, "dtype": "uint8", "nbytes": 1}]}, [bytes(1)]),
    with_header({**BASE, "tensors": [{"shape": [1], "dtype": "uint8", "nbytes": 1.0}]}, [bytes(1)]),
    with_header({**BASE, "tensors": [[1]]}, [bytes(1)]),
], ids=lambda parts: repr(parts)[:40])
def test_malformed_headers(parts):
    assert reason_of(parts) == RejectReason.MALFORMED_HEADER


def test_non_finite_in_every_float_dtype_and_both_infinities():
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for bad in (float("nan"), float("inf"), float("-inf")):
            assert reason_of(message([torch.tensor([1.0, bad], dtype=dtype)])) == RejectReason.NON_FINITE


def test_unhashable_dtype_is_rejected_not_raised():
    for dtype in ([1], {"a": 1}, None, 7):
        parts = edited([torch.zeros(2)], lambda header, dtype=dtype: header["tensors"][0].update(dtype=dtype))
        assert reason_of(parts) == RejectReason.DTYPE_NOT_ALLOWED


def test_zero_size_tensor_with_a_huge_dimension_is_refused_before_allocation():
    parts = with_header({**BASE, "tensors": [{"shape": [0, 2**64 - 1], "dtype": "float32", "nbytes": 0}]}, [b""])
    assert reason_of(parts) == RejectReason.FRAME_TOO_LARGE


def test_frame_larger_than_the_limit_even_if_declared_consistently():
    assert reason_of(message([torch.zeros(100)]), WireLimits(max_frame_bytes=100)) == RejectReason.FRAME_TOO_LARGE


# -- fuzz ---------------------------------------------------------------------------------

hostile = st.one_of(
    st.integers(-(2**63), 2**64 - 1), st.booleans(), st.none(), st.floats(), st.text(max_size=8),
    st.binary(max_size=8), st.lists(st.integers(-3, 2**40), max_size=4),
    # msgpack holds integers in [-2**63, 2**64): larger ones cannot even be sent.
    st.dictionaries(st.text(max_size=3), st.integers(-(2**63), 2**64 - 1), max_size=2),
)
not_a_frame = st.one_of(st.none(), st.integers(), st.text(max_size=4), st.just(memoryview(bytes(8))[::2]))


def _mutate(parts: list[Any], data: st.DataObject) -> list[Any]:
    parts = [bytes(part) for part in parts]
    action = data.draw(st.sampled_from(
        ["flip", "truncate", "drop", "swap", "duplicate", "extend", "header_field", "spec_field",
         "lying_shape", "not_a_frame"]))
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
    elif action == "swap":
        other = data.draw(st.integers(0, len(parts) - 1))
        parts[index], parts[other] = parts[other], parts[index]
    elif action == "duplicate":
        parts.insert(index, parts[index])
    elif action == "extend":
        parts.append(data.draw(st.binary(max_size=64)))
    elif action == "header_field":
        header = header_of(parts)
        header[data.draw(st.sampled_from([*sorted(header), "unknown"]))] = data.draw(hostile)
        parts[0] = msgpack.packb(header, use_bin_type=True)
    elif action == "spec_field" and header_of(parts)["tensors"]:
        header = header_of(parts)
        spec = data.draw(st.sampled_from(header["tensors"]))
        spec[data.draw(st.sampled_from(["shape", "dtype", "nbytes", "other"]))] = data.draw(hostile)
        parts[0] = msgpack.packb(header, use_bin_type=True)
    elif action == "lying_shape" and header_of(parts)["tensors"]:
        # A self-consistent spec (shape × itemsize = nbytes) whose frame is another size.
        header = header_of(parts)
        spec = data.draw(st.sampled_from(header["tensors"]))
        shape = data.draw(st.lists(st.integers(0, 64), max_size=3))
        itemsize = {"float32": 4, "int64": 8}[spec["dtype"]]
        count = 1
        for dim in shape:
            count *= dim
        spec.update(shape=shape, nbytes=count * itemsize)
        parts[0] = msgpack.packb(header, use_bin_type=True)
    elif action == "not_a_frame":
        parts[index] = data.draw(not_a_frame)
    return parts


def outcome_of(parts: Any) -> DecodedMessage | RejectReason:
    """What decode_message makes of parts: the message, or the reason it refused them.

    Any exception other than WireReject propagates and fails the test.
    """
    try:
        return decode_message(parts, expected_run_id=RUN)
    except WireReject as reject:
        return reject.reason


def assert_consistent(outcome: DecodedMessage | RejectReason) -> None:
    """Exactly one of: decoded, or rejected with one known reason. What decodes matches its header."""
    assert isinstance(outcome, (DecodedMessage, RejectReason))
    if isinstance(outcome, DecodedMessage):
        assert len(outcome.tensors) == len(outcome.header.tensors)
        for tensor, spec in zip(outcome.tensors, outcome.header.tensors, strict=True):
            assert list(tensor.shape) == spec["shape"]
            assert tensor.numel() * tensor.element_size() == spec["nbytes"]


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_fuzz_mutated_messages_never_raise(data):
    assert_consistent(outcome_of(_mutate(message(), data)))


@settings(max_examples=200, deadline=None)
@given(parts=st.lists(st.one_of(st.binary(max_size=200), not_a_frame), max_size=6))
def test_fuzz_random_parts_never_raise(parts):
    outcome = outcome_of(parts)
    assert isinstance(outcome, RejectReason)  # random bytes are never a valid header for this run
    assert_consistent(outcome)


@settings(max_examples=100, deadline=None)
@given(header=st.dictionaries(st.sampled_from([*BASE, "tensors", "extra", "stage", "codec"]), hostile),
       frames=st.lists(st.binary(max_size=32), max_size=3))
def test_fuzz_well_formed_msgpack_with_hostile_fields_never_raises(header, frames):
    assert_consistent(outcome_of(with_header(header, frames)))
