"""The data-path messages of a worker (forward activations, backward gradients) on top of
noloco_rt.net.wire, which validates everything received."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

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


@dataclass
class Outgoing:
    """A message ready to send, kept so a retry can re-send it with a new attempt id."""

    header: Header
    frames: list[Any]
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
        frames.append(memoryview(tensor.numpy()).cast("B"))  # no copy: ZeroMQ sends the tensor's memory
    return specs, frames


def _message(kind: MessageKind, run_id: str, sender: str, stage: int, microbatch_id: int, attempt: int,
             tensors: list[torch.Tensor], reply_to: str = "") -> Outgoing:
    specs, frames = _tensor_frames(tensors)
    header = Header(version=PROTOCOL_VERSION, run_id=run_id, kind=kind, sender=sender, microbatch_id=microbatch_id,
                    attempt=attempt, outer_step=0, stage=stage, codec="raw", tensors=specs,
                    extra={"reply_to": reply_to} if reply_to else {})
    return Outgoing(header, frames)


def forward(run_id: str, sender: str, stage: int, microbatch_id: int, reply_to: str, activations: torch.Tensor,
            targets: torch.Tensor) -> Outgoing:
    """Stage output (B, T, C) float32 and the targets (B, T) int64 that travel to the last stage."""
    return _message(MessageKind.FORWARD, run_id, sender, stage, microbatch_id, 0, [activations, targets], reply_to)


def backward(run_id: str, sender: str, stage: int, microbatch_id: int, attempt: int,
             grad: torch.Tensor) -> Outgoing:
    """Gradient of the loss with respect to the forward's activations, for (microbatch_id, attempt)."""
    return _message(MessageKind.BACKWARD, run_id, sender, stage, microbatch_id, attempt, [grad])


def with_attempt(message: Outgoing, attempt: int) -> Outgoing:
    return Outgoing(replace(message.header, attempt=attempt), message.frames)


def decode(parts: list[Any], *, run_id: str) -> DataMessage:
    """Validate and decode a data-path message; raises WireReject with the reason."""
    # No finite check here: a non-finite activation or gradient shows up in the gradient
    # norm, and the inner step refuses to apply a non-finite update (optim.InnerOptimizer).
    decoded: DecodedMessage = decode_message(parts, expected_run_id=run_id, limits=DATA_LIMITS,
                                             check_finite=False, copy=False)
    header = decoded.header
    expected = {MessageKind.FORWARD: [torch.float32, torch.int64], MessageKind.BACKWARD: [torch.float32]}
    wanted = expected.get(MessageKind(header.kind))
    if wanted is None or [t.dtype for t in decoded.tensors] != wanted:
        raise WireReject(RejectReason.FRAME_COUNT_MISMATCH, f"{header.kind} needs tensors of {wanted}")
    return DataMessage(kind=MessageKind(header.kind), sender=header.sender, stage=header.stage,
                       microbatch_id=header.microbatch_id, attempt=header.attempt,
                       reply_to=str(header.extra.get("reply_to", "")), tensors=list(decoded.tensors))
