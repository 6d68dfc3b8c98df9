"""The data path's wire form in the simulator (pipeline.simulate_wire_dtype): between two
stages, activations go forward as workers pack them in pipeline.wire_dtype and gradients
come back in its gradient dtype (noloco_rt.net.wire_dtype), so a wire codec's cost in loss
can be measured here before workers use it."""

from __future__ import annotations

from typing import Any

import torch

from noloco_rt.net.wire_dtype import gradient_wire_dtype, pack, unpack


class _ThroughWire(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, wire_dtype: str) -> torch.Tensor:  # type: ignore[override]
        ctx.wire_dtype = wire_dtype
        return unpack(pack(hidden, wire_dtype)).to(hidden.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return unpack(pack(grad, gradient_wire_dtype(ctx.wire_dtype))).to(grad.dtype), None


def through_wire(hidden: torch.Tensor, wire_dtype: str) -> torch.Tensor:
    """`hidden` as the next stage receives it, its gradient as the previous stage receives it
    (float32: `hidden` itself, nothing rounded)."""
    if wire_dtype == "float32":
        return hidden
    return _ThroughWire.apply(hidden, wire_dtype)
