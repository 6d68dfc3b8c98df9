"""The one device a pure function's tensors share, or a clear error (no I/O, no copies).

The outer exchange's pure functions (peer checks, the correction, the group step, the
codecs) take tensors from two sides: ours and a partner's. On an accelerator a mix of
host and device tensors fails deep inside torch, and a catch-all once turned that into a
silent local step on every outer step. These functions call `one_device` first, so a
mix is refused at their door with both devices named.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def one_device(*groups: Iterable[torch.Tensor], what: str) -> torch.device | None:
    """The device every tensor of every group is on (None when there are none).

    Raises ValueError naming two of the devices when they differ: the caller must move
    its inputs across the device boundary first (workers/outer/device_boundary.py)."""
    found: torch.device | None = None
    for group in groups:
        for tensor in group:
            if found is None:
                found = tensor.device
            elif tensor.device != found:
                raise ValueError(f"{what}: tensors on two devices, {found} and {tensor.device}; "
                                 "bring them to one device before calling")
    return found
