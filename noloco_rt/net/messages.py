"""The data-path messages of a worker (forward activations, backward gradients) on top of
noloco_rt.net.wire, which validates everything received."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from noloco_rt.net.addresses import peer_address_problem
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
from noloco_rt.net.wire_dtype import WireDtypeError, frames_of, unpack

# What follows the packed activation or gradient (noloco_rt.net.wire_dtype) in each kind.
_AFTER_PACKED = {MessageKind.FORWARD: [torch.int64], MessageKind.BACKWARD: []}

# Activations of a 7b stage at batch 8 × 4096 tokens are 512 MiB in float32: bound the frames there.
DATA_LIMITS = WireLimits(max_frame_bytes=1 << 30, max_message_bytes=(1 << 30) + (1 << 20))


@dataclass(frozen=True)
class DataMessage:
    kind: MessageKind
    sender: str
    stage: int
    microbatch_id: int
    attempt: int
    reply_to: str
    tensors: list[torch.Tensor]
    origin_step: int | None = None
    """A forward's: the stage-0 inner step its data belongs to (None when the sender did not say)."""
    held_s: float | None = None
    """A gradient's: how long its sender held the forward before replying (None: not said)."""
    received_at: float | None = None
    """When this worker's link took the message off the wire (time.monotonic; None: not stamped)."""


@dataclass
class Outgoing:
    """A message ready to send, kept so a retry can re-send it with a new attempt id."""

    header: Header
    frames: list[Any]
    ready: Callable[[], None] | None = None
    """Wait for this before the frames are read (their device-to-host copy may be running)."""
    _parts: list[Any] | None = None

    def parts(self) -> list[Any]:
        if self._parts is None:  # encode the header once, however often it is sent
            self._parts = encode_message(self.header, self.frames)
        return self._parts


def _tensor_frames(tensors: list[torch.Tensor]) -> tuple[list[dict[str, Any]], list[Any]]:
    specs, frames = [], []
    for tensor in tensors:
        tensor = tensor.detach().contiguous().cpu()
        specs.append({"shape": list(tensor.shape), "dtype": str(tensor.dtype).removeprefix("torch."),
                      "nbytes": tensor.numel() * tensor.element_size()})
        # No copy: ZeroMQ sends the tensor's memory (viewed as bytes: numpy has no bfloat16).
        frames.append(memoryview(tensor.reshape(-1).view(torch.uint8).numpy()).cast("B"))
    return specs, frames


def _message(kind: MessageKind, run_id: str, sender: str, stage: int, microbatch_id: int, attempt: int,
             tensors: list[torch.Tensor], extra: HeaderExtra | None = None) -> Outgoing:
    specs, frames = _tensor_frames(tensors)
    header = Header(version=PROTOCOL_VERSION, run_id=run_id, kind=kind, sender=sender, microbatch_id=microbatch_id,
                    attempt=attempt, outer_step=0, stage=stage, codec="raw", tensors=specs,
                    extra=extra or HeaderExtra())
    return Outgoing(header, frames)


def forward(run_id: str, sender: str, stage: int, microbatch_id: int, reply_to: str,
            activations: list[torch.Tensor], targets: torch.Tensor, *, origin_step: int | None = None,
            ready: Callable[[], None] | None = None) -> Outgoing:
    """Stage output (B, T, C) packed in the wire dtype (noloco_rt.net.wire_dtype.pack) and the
    targets (B, T) int64 that travel to the last stage; `origin_step`: the stage-0 inner step
    of this data, which a later stage's outer-step clock follows; `ready`: see Outgoing."""
    extra = HeaderExtra(reply_to=reply_to or None, origin_step=origin_step)
    message = _message(MessageKind.FORWARD, run_id, sender, stage, microbatch_id, 0, [*activations, targets],
                       extra)
    message.ready = ready
    return message


def backward(run_id: str, sender: str, stage: int, microbatch_id: int, attempt: int,
             grad: list[torch.Tensor], *, held_s: float | None = None,
             ready: Callable[[], None] | None = None) -> Outgoing:
    """Gradient of the loss with respect to the forward's activations, packed in the wire
    dtype, for (microbatch_id, attempt); `held_s`: how long we held the forward (the sender
    learns its link from it); `ready`: see Outgoing."""
    held_us = None if held_s is None else max(0, round(held_s * 1e6))
    message = _message(MessageKind.BACKWARD, run_id, sender, stage, microbatch_id, attempt, grad,
                       HeaderExtra(held_us=held_us))
    message.ready = ready
    return message


def with_attempt(message: Outgoing, attempt: int) -> Outgoing:
    return Outgoing(replace(message.header, attempt=attempt), message.frames, message.ready)


def decode(parts: list[Any], *, run_id: str) -> DataMessage:
    """Validate and decode a data-path message; raises WireReject with the reason."""
    # No finite check here: a non-finite activation or gradient shows up in the gradient
    # norm, and the inner step refuses to apply a non-finite update (optim.InnerOptimizer).
    decoded: DecodedMessage = decode_message(parts, expected_run_id=run_id, limits=DATA_LIMITS,
                                             check_finite=False, copy=False)
    header = decoded.header
    kind = MessageKind(header.kind)
    if kind not in _AFTER_PACKED:
        raise WireReject(RejectReason.FRAME_COUNT_MISMATCH, f"{header.kind} is not a data-path message")
    tensors = list(decoded.tensors)
    try:
        packed = frames_of([t.dtype for t in tensors])
        if [t.dtype for t in tensors[packed:]] != _AFTER_PACKED[kind]:
            raise WireDtypeError(f"{kind.value} carries one packed tensor then {_AFTER_PACKED[kind]}")
        value = unpack(tensors[:packed])
    except WireDtypeError as exc:
        raise WireReject(RejectReason.FRAME_COUNT_MISMATCH, f"{header.kind}: {exc}") from None
    return DataMessage(kind=kind, sender=header.sender, stage=header.stage, microbatch_id=header.microbatch_id,
                       attempt=header.attempt, reply_to=_reply_to(header),
                       tensors=[value, *tensors[packed:]], origin_step=_origin_step(header),
                       held_s=None if header.extra.held_us is None else header.extra.held_us / 1e6)


def _reply_to(header: Header) -> str:
    """Where a forward's gradient goes: "" (none given), else a peer address (tcp://host:port;
    we connect to it)."""
    value = header.extra.reply_to or ""
    if value == "":
        return ""
    if (problem := peer_address_problem(value)) is not None:
        raise WireReject(RejectReason.MALFORMED_HEADER, f"reply_to: {problem}")
    return value


def _origin_step(header: Header) -> int | None:
    """A forward's origin step: absent is None (an older sender); its type was checked on decode."""
    return header.extra.origin_step
