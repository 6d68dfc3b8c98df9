"""A second device on a CPU-only machine, for tests of the outer exchange's device boundary.

CI has no GPU, yet the bug to guard against is one of devices: on CUDA, an operation that
mixes a host tensor with a device tensor raises "Expected all tensors to be on the same
device". `on_other_device(t)` wraps a CPU tensor in a subclass that reports another device
(`meta`) while keeping its real values, and, like CUDA, refuses any operation that mixes
it with a host tensor (0-dim scalars excepted). Crossing is explicit, as on CUDA:
`t.to("cpu")` / `t.cpu()` bring it to the host, `device_tensor.copy_(host)` and
`host.copy_(device_tensor)` copy across.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

OTHER_DEVICE = torch.device("meta")


class OnOtherDevice(torch.Tensor):
    inner: torch.Tensor

    @staticmethod
    def __new__(cls, inner: torch.Tensor) -> OnOtherDevice:
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype, device=OTHER_DEVICE,
                                                   strides=inner.stride(), requires_grad=False)

    def __init__(self, inner: torch.Tensor) -> None:
        self.inner = inner

    def __repr__(self) -> str:  # noqa: D105
        return f"OnOtherDevice({self.inner!r})"

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        tensors = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        on_host = [a for a in tensors if not isinstance(a, OnOtherDevice) and a.dim() > 0]
        if func is torch.ops.aten.copy_.default:  # an explicit crossing, either way
            destination, source = args[0], args[1]
            target = destination.inner if isinstance(destination, OnOtherDevice) else destination
            target.copy_(source.inner if isinstance(source, OnOtherDevice) else source)
            return destination
        if func is torch.ops.aten._to_copy.default and kwargs.get("device") == torch.device("cpu"):
            return func(_unwrap(args[0]), **kwargs)  # to the host: a plain tensor
        if on_host:
            raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                               f"{OTHER_DEVICE} and cpu! ({func})")
        if kwargs.get("device") == OTHER_DEVICE:
            kwargs.pop("device")
        out = func(*tree_map(_unwrap, args), **tree_map(_unwrap, kwargs))
        return tree_map(lambda o: OnOtherDevice(o) if type(o) is torch.Tensor else o, out)


def _unwrap(value: Any) -> Any:
    return value.inner if isinstance(value, OnOtherDevice) else value


def on_other_device(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of `tensor` that lives on the stand-in device."""
    return OnOtherDevice(tensor.detach().clone())


def values(tensor: torch.Tensor) -> torch.Tensor:
    """The real values of a tensor on either device, as a plain host tensor."""
    return tensor.inner.clone() if isinstance(tensor, OnOtherDevice) else tensor.detach().clone()
