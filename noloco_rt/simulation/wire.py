"""The data path's wire form in the simulator (pipeline.simulate_wire_dtype): between two
stages, activations go forward as workers pack them in pipeline.wire_dtype and gradients
come back in pipeline.gradient_wire_dtype (noloco_rt.net.wire_dtype), so a wire codec's cost in loss
can be measured here before workers use it."""

from __future__ import annotations

from typing import Any

import torch

from noloco_rt.net.wire_dtype import gradient_wire_dtype, pack, unpack


class _ThroughWire(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, wire_dtype: str,  # type: ignore[override]
                gradient_dtype: str) -> torch.Tensor:
        ctx.gradient_dtype = gradient_dtype
        return _round_trip(hidden, wire_dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        return _round_trip(grad, ctx.gradient_dtype), None, None


def _round_trip(tensor: torch.Tensor, wire_dtype: str) -> torch.Tensor:
    return tensor if wire_dtype == "float32" else unpack(pack(tensor, wire_dtype)).to(tensor.dtype)


def through_wire(hidden: torch.Tensor, wire_dtype: str, gradient_choice: str = "auto") -> torch.Tensor:
    """`hidden` as the next stage receives it, its gradient as the previous stage receives it
    (in pipeline.gradient_wire_dtype `gradient_choice`; float32 both ways: `hidden` itself)."""
    gradient_dtype = gradient_wire_dtype(wire_dtype, gradient_choice)
    if wire_dtype == gradient_dtype == "float32":
        return hidden
    return _ThroughWire.apply(hidden, wire_dtype, gradient_dtype)
