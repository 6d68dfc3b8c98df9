"""Wire format (DESIGN §6): one msgpack header, then raw tensor frames (pure, no sockets).

Everything received is untrusted. decode_message checks version, run, kind, the tensor
list against the frames (count, dtype allow-list, shape × itemsize = byte length) and
size limits before it builds a single tensor, and raises WireReject with a reason.
safe_decode never raises: it counts the reason and returns None.
"""

from __future__ import annotations

import enum
import math
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import msgpack
import torch

from noloco_rt.codec import ALLOWED_DTYPES

PROTOCOL_VERSION = 1


class MessageKind(enum.StrEnum):
    FORWARD = "forward"
    BACKWARD = "backward"
    SNAPSHOT_REQUEST = "snapshot_request"
    SNAPSHOT_REPLY = "snapshot_reply"
    BOOTSTRAP_REQUEST = "bootstrap_request"
    BOOTSTRAP_REPLY = "bootstrap_reply"
    ERROR = "error"


class RejectReason(enum.StrEnum):
    MALFORMED_HEADER = "malformed_header"
    HEADER_TOO_LARGE = "header_too_large"
    UNKNOWN_VERSION = "unknown_version"
    WRONG_RUN = "wrong_run"
    UNKNOWN_KIND = "unknown_kind"
    TOO_MANY_FRAMES = "too_many_frames"
    FRAME_COUNT_MISMATCH = "frame_count_mismatch"
    DTYPE_NOT_ALLOWED = "dtype_not_allowed"
    SHAPE_BYTES_MISMATCH = "shape_bytes_mismatch"
    FRAME_TOO_LARGE = "frame_too_large"
    MESSAGE_TOO_LARGE = "message_too_large"
    NON_FINITE = "non_finite"


class WireReject(ValueError):
    def __init__(self, reason: RejectReason, detail: str = "") -> None:
        super().__init__(f"{reason.value}: {detail}" if detail else reason.value)
        self.reason = reason


@dataclass(frozen=True)
class WireLimits:
    max_header_bytes: int = 64 * 1024
    max_frame_bytes: int = 256 * 1024 * 1024
    max_message_bytes: int = 512 * 1024 * 1024
    max_frames: int = 4096


@dataclass(frozen=True)
class Header:
    version: int
    run_id: str
    kind: str
    sender: str
    microbatch_id: int = 0
    attempt: int = 0
    outer_step: int = 0
    stage: int = 0
    codec: str = "raw"
    tensors: list[dict[str, Any]] = field(default_factory=list)
    """One {shape, dtype, nbytes} per frame after the header."""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DecodedMessage:
    header: Header
    tensors: list[torch.Tensor]


_INT_FIELDS = ("version", "microbatch_id", "attempt", "outer_step", "stage")
_STR_FIELDS = ("run_id", "kind", "sender", "codec")


def encode_message(header: Header, frames: Sequence[Any]) -> list[Any]:
    """[header bytes, *frames]: frames pass through untouched so ZeroMQ can send them without copies."""
    fields = asdict(header)
    fields["kind"] = str(header.kind)
    return [msgpack.packb(fields, use_bin_type=True), *frames]


def _frame_bytes(frame: Any) -> memoryview:
    buffer = getattr(frame, "buffer", frame)  # zmq.Frame exposes .buffer
    return memoryview(buffer).cast("B") if not isinstance(buffer, bytes) else memoryview(buffer)


def _parse_header(raw: memoryview, limits: WireLimits) -> Header:
    if len(raw) > limits.max_header_bytes:
        raise WireReject(RejectReason.HEADER_TOO_LARGE, f"{len(raw)} bytes")
    try:
        fields = msgpack.unpackb(raw, raw=False, strict_map_key=True, max_bin_len=limits.max_header_bytes,
                                 max_str_len=limits.max_header_bytes, max_array_len=limits.max_frames,
                                 max_map_len=256)
    except (msgpack.UnpackException, ValueError, TypeError) as exc:
        raise WireReject(RejectReason.MALFORMED_HEADER, str(exc)) from None
    if not isinstance(fields, dict):
        raise WireReject(RejectReason.MALFORMED_HEADER, "header is not a map")
    version = fields.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise WireReject(RejectReason.MALFORMED_HEADER, "no version")
    if version != PROTOCOL_VERSION:
        raise WireReject(RejectReason.UNKNOWN_VERSION, f"version {version}")
    known = set(_INT_FIELDS) | set(_STR_FIELDS) | {"tensors", "extra"}
    if set(fields) - known:
        raise WireReject(RejectReason.MALFORMED_HEADER, f"unknown fields {sorted(set(fields) - known)}")
    for name in _INT_FIELDS:
        value = fields.get(name, 0)
        if not isinstance(value, int) or isinstance(value, bool):
            raise WireReject(RejectReason.MALFORMED_HEADER, f"{name} is not an integer")
    for name in _STR_FIELDS:
        if not isinstance(fields.get(name, ""), str):
            raise WireReject(RejectReason.MALFORMED_HEADER, f"{name} is not a string")
    if not isinstance(fields.get("tensors", []), list) or not isinstance(fields.get("extra", {}), dict):
        raise WireReject(RejectReason.MALFORMED_HEADER, "tensors must be a list and extra a map")
    try:
        return Header(**fields)
    except TypeError as exc:  # a required field is missing
        raise WireReject(RejectReason.MALFORMED_HEADER, str(exc)) from None


def _tensor_spec(spec: Any, limits: WireLimits) -> tuple[tuple[int, ...], torch.dtype, int]:
    if not isinstance(spec, dict):
        raise WireReject(RejectReason.MALFORMED_HEADER, "tensor spec is not a map")
    shape, dtype_name, nbytes = spec.get("shape"), spec.get("dtype"), spec.get("nbytes")
    if dtype_name not in ALLOWED_DTYPES:
        raise WireReject(RejectReason.DTYPE_NOT_ALLOWED, repr(dtype_name))
    if (not isinstance(shape, list) or len(shape) > 8
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise WireReject(RejectReason.MALFORMED_HEADER, f"shape {shape!r}")
    if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
        raise WireReject(RejectReason.MALFORMED_HEADER, f"nbytes {nbytes!r}")
    if nbytes > limits.max_frame_bytes:
        raise WireReject(RejectReason.FRAME_TOO_LARGE, f"declares {nbytes} bytes")
    dtype = ALLOWED_DTYPES[dtype_name]
    if math.prod(shape) * dtype.itemsize != nbytes:
        raise WireReject(RejectReason.SHAPE_BYTES_MISMATCH, f"shape {shape} of {dtype_name} vs {nbytes} bytes")
    return tuple(shape), dtype, nbytes


def decode_message(parts: Sequence[Any], *, expected_run_id: str, limits: WireLimits = WireLimits(),
                   check_finite: bool = True, copy: bool = True) -> DecodedMessage:
    """Validate and decode. copy=False returns tensors that view the received frames
    (read-only memory: the caller must not modify them in place); it saves a memcpy of
    every activation on the data path."""
    if not parts:
        raise WireReject(RejectReason.MALFORMED_HEADER, "no frames")
    if len(parts) - 1 > limits.max_frames:
        raise WireReject(RejectReason.TOO_MANY_FRAMES, f"{len(parts) - 1} frames")
    header = _parse_header(_frame_bytes(parts[0]), limits)
    if header.run_id != expected_run_id:
        raise WireReject(RejectReason.WRONG_RUN, f"run {header.run_id!r}")
    try:
        MessageKind(header.kind)
    except ValueError:
        raise WireReject(RejectReason.UNKNOWN_KIND, repr(header.kind)) from None
    frames = parts[1:]
    if len(header.tensors) != len(frames):
        raise WireReject(RejectReason.FRAME_COUNT_MISMATCH, f"{len(header.tensors)} specs, {len(frames)} frames")
    specs = [_tensor_spec(spec, limits) for spec in header.tensors]
    total = 0
    views = []
    for (_shape, _dtype, nbytes), frame in zip(specs, frames, strict=True):
        view = _frame_bytes(frame)
        if len(view) > limits.max_frame_bytes:
            raise WireReject(RejectReason.FRAME_TOO_LARGE, f"{len(view)} bytes")
        if len(view) != nbytes:
            raise WireReject(RejectReason.SHAPE_BYTES_MISMATCH, f"frame of {len(view)} bytes, declared {nbytes}")
        total += nbytes
        if total > limits.max_message_bytes:
            raise WireReject(RejectReason.MESSAGE_TOO_LARGE, f"over {limits.max_message_bytes} bytes")
        views.append(view)
    tensors = []
    for (shape, dtype, nbytes), view in zip(specs, views, strict=True):
        if nbytes == 0:
            tensor = torch.empty(shape, dtype=dtype)
        elif copy:
            # Received frames are read-only; one copy makes the tensor safe to own and modify.
            tensor = torch.frombuffer(bytearray(view), dtype=dtype).reshape(shape)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # "buffer is not writable": we never write
                tensor = torch.frombuffer(view, dtype=dtype).reshape(shape)
        if check_finite and tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise WireReject(RejectReason.NON_FINITE)
        tensors.append(tensor)
    return DecodedMessage(header=header, tensors=tensors)


class RejectCounter(Counter):
    """Rejections by reason."""


def safe_decode(parts: Sequence[Any], *, expected_run_id: str, counter: RejectCounter,
                limits: WireLimits = WireLimits(), check_finite: bool = True) -> DecodedMessage | None:
    """decode_message that never raises: a rejected message is counted by reason and dropped."""
    try:
        return decode_message(parts, expected_run_id=expected_run_id, limits=limits, check_finite=check_finite)
    except WireReject as reject:
        counter[reject.reason.value] += 1
        return None
