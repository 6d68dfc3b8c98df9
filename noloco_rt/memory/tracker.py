"""Peak tensor memory of a piece of code on the CPU, where torch keeps no allocator statistics.

Every tensor an operator returns is looked at while the tracker is active; its storage is
counted once, when first seen, and uncounted when torch frees it (a weak reference on the
storage). The live total's maximum is the peak. Only storages created while tracking are
seen (views and in-place results share an input's storage and are skipped), so a
measurement should build what it measures (the replica too) inside `with`.
On CUDA use torch.cuda.max_memory_allocated instead (benchmarks/memory_plan.py does).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class TensorMemoryTracker(TorchDispatchMode):
    """`with TensorMemoryTracker() as tracker: ...`, then `tracker.peak_bytes`."""

    def __init__(self, device_type: str = "cpu") -> None:
        super().__init__()
        self.device_type = device_type
        self.live_bytes = 0
        self.peak_bytes = 0
        self._sizes: dict[int, int] = {}

    def reset_peak(self) -> None:
        """Start a new peak from what is live now."""
        self.peak_bytes = self.live_bytes

    def _freed(self, key: int) -> None:
        self.live_bytes -= self._sizes.pop(key, 0)

    def _see(self, tensor: torch.Tensor) -> None:
        if tensor.device.type != self.device_type or tensor.is_meta:
            return
        storage = tensor.untyped_storage()
        key = storage._cdata  # the storage itself, whatever tensors or views share it
        if key in self._sizes:
            return
        self._sizes[key] = storage.nbytes()
        self.live_bytes += storage.nbytes()
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        weakref.finalize(storage, self._freed, key)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if any(r.alias_info is not None for r in func._schema.returns):
            return out  # a view or an in-place op: its storage is an input's, not new memory
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self._see(leaf)
        return out
