"""Which accelerator a worker uses, and copies between it and the host for the wire."""

from __future__ import annotations

import torch


def pick_device(local_rank: int) -> torch.device:
    """CUDA when present (one device per local rank), else CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The dtype the stage's forward autocasts to for `model.precision`, or None (float32)."""
    if precision == "bfloat16" or (precision == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


class HostStaging:
    """Device <-> host copies for the wire; on CUDA through pinned buffers reused per shape."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._pinned: dict[tuple[tuple[int, ...], torch.dtype], torch.Tensor] = {}

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.detach()
        if self.device.type != "cuda":
            return tensor.contiguous()
        key = (tuple(tensor.shape), tensor.dtype)
        buffer = self._pinned.get(key)
        if buffer is None:
            buffer = self._pinned[key] = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        buffer.copy_(tensor, non_blocking=True)
        torch.cuda.current_stream(self.device).synchronize()
        return buffer.clone()  # the wire keeps a reference while ZeroMQ sends it; the buffer is reused

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.device.type != "cuda":
            return tensor
        return tensor.pin_memory().to(self.device, non_blocking=True)
