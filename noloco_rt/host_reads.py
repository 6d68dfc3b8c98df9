"""Counting the reads that make the host wait for the device (docs/architecture.md §9).

`.item()`, `float(t)`, `bool(t)`, `int(t)` and comparisons of whole tensors all reach the
device through a few aten ops; on a GPU each is a synchronisation that stalls the host's
queue of launches. A dispatch mode sees them on any device, the CPU included, so tests on a
machine without a GPU can hold the training thread to none per inner step. The mode is
thread-local: it counts only the thread that entered it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_aten = torch.ops.aten
HOST_READ_OPS = frozenset({_aten._local_scalar_dense.default, _aten.is_nonzero.default, _aten.equal.default,
                           _aten.item.default})
"""The ops whose result is a Python value read from a tensor's storage."""


class HostReadCounter(TorchDispatchMode):
    """Counts host reads of tensors in the thread that entered it (`count`, and by op in `ops`)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    @property
    def count(self) -> int:
        return sum(self.ops.values())

    def take(self) -> int:
        """The count so far, starting again from zero."""
        count = self.count
        self.ops.clear()
        return count

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in HOST_READ_OPS:
            self.ops[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))
