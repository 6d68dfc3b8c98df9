"""Wire format (docs/architecture.md §6): one msgpack header, then raw tensor frames (pure, no sockets).

Everything received is untrusted. decode_message checks the frame count, header size,
version, run, kind, the tensor list against the frames (count, dtype allow-list,
shape × itemsize = declared bytes = frame bytes) and size limits before it builds a
single tensor, and raises WireReject with a reason, nothing else, whatever the input.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import msgpack
import torch

from noloco_rt.net.header_extra import ExtraError, HeaderExtra

ALLOWED_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int64": torch.int64,
    "int32": torch.int32,
    "uint8": torch.uint8,
    "int8": torch.int8,
}
"""The tensor dtypes a header may name: anything else is rejected before a byte is read."""


PROTOCOL_VERSION = 1
# Tensors of more dimensions than this are not something a stage sends; a bound keeps a
# hostile header from making shape handling expensive.
MAX_TENSOR_NDIM = 8
# Small maps only: the header carries ids and a few extras, never bulk data.
_MAX_HEADER_MAP_LEN = 256


class MessageKind(enum.StrEnum):
    FORWARD = "forward"
    BACKWARD = "backward"
    SNAPSHOT_PUSH = "snapshot_push"
    """A group member's outer-step contribution, pushed to a partner (docs/architecture.md §4)."""
    SNAPSHOT_ACK = "snapshot_ack"
    """The partner validated and kept a push."""
    OUTER_CONFIRM = "outer_confirm"
    """A pusher whose acknowledgement was lost: "I kept yours for your step k; do you use mine?"
    (workers/outer/verdicts.py)."""
    OUTER_VERDICT = "outer_verdict"
    """The answer: used, declined, pending (ask again) or unknown; or, unasked, a finishing
    or leaving partner's decision on our push."""
    BOOTSTRAP_REQUEST = "bootstrap_request"
    BOOTSTRAP_REPLY = "bootstrap_reply"
    PROBE = "probe"
    """A link round trip asked of an exchange server (a joiner ordering its donors,
    noloco_rt/net/link_probe.py): answered at once with PROBE_REPLY, whatever our stage."""
    PROBE_REPLY = "probe_reply"
    ERROR = "error"


class RejectReason(enum.StrEnum):
    MALFORMED_HEADER = "malformed_header"
    """No frames, not msgpack, not a map, a missing or mistyped field, an unknown field."""
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
    MALFORMED_FRAME = "malformed_frame"
    """A frame that is not a contiguous byte buffer."""


class WireReject(ValueError):
    """A received message is refused; `reason` says why (for counting), the text says more."""

    def __init__(self, reason: RejectReason, detail: str = "") -> None:
        super().__init__(f"{reason.value}: {detail}" if detail else reason.value)
        self.reason = reason


@dataclass(frozen=True, kw_only=True)
class WireLimits:
    """Bounds on what a receiver accepts; every one is checked before tensors are built."""

    max_header_bytes: int = 64 * 1024
    max_frame_bytes: int = 256 * 1024 * 1024
    """Largest single tensor frame."""
    max_message_bytes: int = 512 * 1024 * 1024
    """Header plus all frames."""
    max_frames: int = 4096
    """Tensor frames after the header."""

    def __post_init__(self) -> None:
        for name in ("max_header_bytes", "max_frame_bytes", "max_message_bytes", "max_frames"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"WireLimits.{name} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class Header:
    version: int
    run_id: str
    kind: str
    """A MessageKind value (decoded headers hold the MessageKind itself)."""
    sender: str
    microbatch_id: int = 0
    attempt: int = 0
    outer_step: int = 0
    stage: int = 0
    codec: str = "raw"
    tensors: list[dict[str, Any]] = field(default_factory=list)
    """One {"shape": [..], "dtype": name, "nbytes": int} per frame after the header."""
    extra: HeaderExtra = field(default_factory=HeaderExtra)
    """What a kind needs beyond these fields (a reply address, a snapshot's specs), typed
    and checked on decode (noloco_rt/net/header_extra.py)."""


@dataclass(frozen=True)
class DecodedMessage:
    header: Header
    tensors: list[torch.Tensor]


_INT_FIELDS = ("version", "microbatch_id", "attempt", "outer_step", "stage")
_STR_FIELDS = ("run_id", "kind", "sender", "codec")
_REQUIRED_FIELDS = ("version", "run_id", "kind", "sender")
_KNOWN_FIELDS = frozenset((*_INT_FIELDS, *_STR_FIELDS, "tensors", "extra"))
_SPEC_FIELDS = frozenset(("shape", "dtype", "nbytes"))
_HEADER_FIELDS = tuple(f.name for f in fields(Header))


def encode_message(header: Header, frames: Sequence[Any]) -> list[Any]:
    """[header bytes, *frames]: the frames pass through untouched so ZeroMQ can send them
    without copies. Raises ValueError if header.tensors and frames differ in number."""
    if len(header.tensors) != len(frames):
        raise ValueError(f"header lists {len(header.tensors)} tensors for {len(frames)} frames")
    # A shallow map, not dataclasses.asdict: its deep copy was a third of a data message's
    # sending cost on the training thread (msgpack reads the lists and maps as they are).
    values = {name: getattr(header, name) for name in _HEADER_FIELDS}
    values["kind"] = str(header.kind)
    values["extra"] = header.extra.to_wire()
    return [msgpack.packb(values, use_bin_type=True), *frames]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _frame_bytes(frame: Any, reason: RejectReason) -> memoryview:
    """A flat byte view of a frame (bytes, bytearray, memoryview, zmq.Frame), without copying."""
    buffer = getattr(frame, "buffer", frame)  # zmq.Frame exposes its memory as .buffer
    try:
        return memoryview(buffer).cast("B")  # a flat view; refuses non-contiguous memory
    except (TypeError, ValueError) as exc:  # not a buffer, or not C-contiguous
        raise WireReject(reason, f"{type(frame).__name__}: {exc}") from None


def _parse_header(raw: memoryview, limits: WireLimits) -> Header:
    if len(raw) > limits.max_header_bytes:
        raise WireReject(RejectReason.HEADER_TOO_LARGE, f"{len(raw)} bytes > {limits.max_header_bytes}")
    try:
        fields = msgpack.unpackb(
            raw, raw=False, strict_map_key=True, max_bin_len=limits.max_header_bytes,
            max_str_len=limits.max_header_bytes, max_array_len=limits.max_frames,
            max_map_len=_MAX_HEADER_MAP_LEN, max_ext_len=0)
    # msgpack's own errors, ExtraData and invalid UTF-8 are ValueErrors; an unhashable
    # map key is a TypeError; deep nesting is a StackError (an UnpackException).
    except (msgpack.UnpackException, ValueError, TypeError) as exc:
        raise WireReject(RejectReason.MALFORMED_HEADER, f"not msgpack: {exc}") from None
    if not isinstance(fields, dict):
        raise WireReject(RejectReason.MALFORMED_HEADER, f"header is a {type(fields).__name__}, not a map")
    version = fields.get("version")
    if not _is_int(version):
        raise WireReject(RejectReason.MALFORMED_HEADER, f"version {version!r} is not an int")
    if version != PROTOCOL_VERSION:  # checked before anything else: newer headers may differ
        raise WireReject(RejectReason.UNKNOWN_VERSION, f"version {version}, expected {PROTOCOL_VERSION}")
    unknown = set(fields) - _KNOWN_FIELDS
    if unknown:
        raise WireReject(RejectReason.MALFORMED_HEADER, f"unknown fields {sorted(map(str, unknown))}")
    missing = [name for name in _REQUIRED_FIELDS if name not in fields]
    if missing:
        raise WireReject(RejectReason.MALFORMED_HEADER, f"missing fields {missing}")
    for name in _INT_FIELDS:
        if name in fields and not _is_int(fields[name]):
            raise WireReject(RejectReason.MALFORMED_HEADER, f"{name} {fields[name]!r} is not an int")
    for name in _STR_FIELDS:
        if name in fields and not isinstance(fields[name], str):
            raise WireReject(RejectReason.MALFORMED_HEADER, f"{name} {fields[name]!r} is not a string")
    if not isinstance(fields.get("tensors", []), list):
        raise WireReject(RejectReason.MALFORMED_HEADER, "tensors is not a list")
    try:
        extra = HeaderExtra.from_wire(fields.pop("extra", {}))
    except ExtraError as exc:
        raise WireReject(RejectReason.MALFORMED_HEADER, str(exc)) from None
    return Header(**fields, extra=extra)


def _tensor_spec(spec: Any, limits: WireLimits) -> tuple[tuple[int, ...], torch.dtype, int]:
    """(shape, dtype, nbytes) of one header tensor entry, or WireReject."""
    if not isinstance(spec, dict) or set(spec) != _SPEC_FIELDS:
        raise WireReject(RejectReason.MALFORMED_HEADER, f"tensor spec {spec!r} is not {{shape, dtype, nbytes}}")
    shape, dtype_name, nbytes = spec["shape"], spec["dtype"], spec["nbytes"]
    # isinstance first: `in` on a dict would raise TypeError for an unhashable list or map.
    if not isinstance(dtype_name, str) or dtype_name not in ALLOWED_DTYPES:
        raise WireReject(RejectReason.DTYPE_NOT_ALLOWED, f"{dtype_name!r}; allowed: {', '.join(ALLOWED_DTYPES)}")
    # No dimension can exceed the frame bound (a non-empty tensor has numel <= its bytes);
    # the bound also keeps zero-size shapes such as [0, 2**64] out of torch.empty.
    if (not isinstance(shape, list) or len(shape) > MAX_TENSOR_NDIM
            or not all(_is_int(dim) and dim >= 0 for dim in shape)):
        raise WireReject(RejectReason.MALFORMED_HEADER, f"shape {shape!r}")
    if not _is_int(nbytes) or nbytes < 0:
        raise WireReject(RejectReason.MALFORMED_HEADER, f"nbytes {nbytes!r}")
    if nbytes > limits.max_frame_bytes or any(dim > limits.max_frame_bytes for dim in shape):
        raise WireReject(RejectReason.FRAME_TOO_LARGE,
                         f"declares {nbytes} bytes, shape {shape}; bound {limits.max_frame_bytes}")
    dtype = ALLOWED_DTYPES[dtype_name]
    if math.prod(shape) * dtype.itemsize != nbytes:
        raise WireReject(RejectReason.SHAPE_BYTES_MISMATCH, f"shape {shape} of {dtype_name} vs {nbytes} bytes")
    return tuple(shape), dtype, nbytes


def _tensor(view: memoryview, shape: tuple[int, ...], dtype: torch.dtype, *, copy: bool) -> torch.Tensor:
    if len(view) == 0:
        return torch.empty(shape, dtype=dtype)  # frombuffer refuses empty buffers
    # Read-only memory (bytes) is always copied: torch warns about it, and a tensor that
    # looks writable must not alias an immutable object. (warnings.catch_warnings is no
    # way around it: it swaps a process-wide filter, which races with other threads.)
    source = bytearray(view) if copy or view.readonly else view
    try:
        return torch.frombuffer(source, dtype=dtype).reshape(shape)
    except (RuntimeError, ValueError, TypeError) as exc:  # the sizes were checked; defensive
        raise WireReject(RejectReason.MALFORMED_FRAME, f"cannot view as {dtype} {shape}: {exc}") from None


def decode_message(parts: Sequence[Any], *, expected_run_id: str, limits: WireLimits | None = None,
                   check_finite: bool = True, copy: bool = True) -> DecodedMessage:
    """Validate a received multipart message and decode its tensors.

    Raises WireReject (and nothing else) on any problem. check_finite rejects NaN/Inf in
    floating tensors (on for weights; the data path turns it off and checks the update).
    copy=True gives tensors that own their memory. copy=False views a writable frame in
    place (a zmq.Frame received with copy=False) and saves a memcpy per activation; the
    tensor then lives on the frame's memory. Read-only frames are copied either way.
    """
    limits = limits or WireLimits()
    if not isinstance(parts, Sequence) or isinstance(parts, str | bytes | bytearray | memoryview):
        raise WireReject(RejectReason.MALFORMED_HEADER, f"parts is a {type(parts).__name__}, not a list")
    if not parts:
        raise WireReject(RejectReason.MALFORMED_HEADER, "no frames")
    frames = parts[1:]
    if len(frames) > limits.max_frames:
        raise WireReject(RejectReason.TOO_MANY_FRAMES, f"{len(frames)} frames > {limits.max_frames}")
    raw_header = _frame_bytes(parts[0], RejectReason.MALFORMED_HEADER)
    header = _parse_header(raw_header, limits)
    if header.run_id != expected_run_id:
        raise WireReject(RejectReason.WRONG_RUN, f"run {header.run_id!r}, expected {expected_run_id!r}")
    try:
        kind = MessageKind(header.kind)
    except ValueError:
        raise WireReject(RejectReason.UNKNOWN_KIND, repr(header.kind)) from None
    if len(header.tensors) != len(frames):
        raise WireReject(RejectReason.FRAME_COUNT_MISMATCH,
                         f"header lists {len(header.tensors)} tensors, {len(frames)} frames came")
    specs = [_tensor_spec(spec, limits) for spec in header.tensors]
    total = len(raw_header)
    views = []
    for index, ((_, _, nbytes), frame) in enumerate(zip(specs, frames, strict=True)):
        view = _frame_bytes(frame, RejectReason.MALFORMED_FRAME)
        if len(view) > limits.max_frame_bytes:
            raise WireReject(RejectReason.FRAME_TOO_LARGE, f"frame {index}: {len(view)} bytes")
        if len(view) != nbytes:
            raise WireReject(RejectReason.SHAPE_BYTES_MISMATCH,
                             f"frame {index}: {len(view)} bytes, header declares {nbytes}")
        total += nbytes
        if total > limits.max_message_bytes:
            raise WireReject(RejectReason.MESSAGE_TOO_LARGE, f"over {limits.max_message_bytes} bytes")
        views.append(view)
    tensors = []
    for index, ((shape, dtype, _), view) in enumerate(zip(specs, views, strict=True)):
        tensor = _tensor(view, shape, dtype, copy=copy)
        if check_finite and tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise WireReject(RejectReason.NON_FINITE, f"tensor {index} holds NaN or Inf")
        tensors.append(tensor)
    return DecodedMessage(header=replace(header, kind=kind), tensors=tensors)
