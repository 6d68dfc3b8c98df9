"""Which accelerator a worker uses, and copies between it and the host for the wire."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch

from noloco_rt.config import Config
from noloco_rt.memory.fit import MemoryChoice, budget_bytes, choose


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


def workers_sharing_device(environ: Mapping[str, str]) -> int:
    """Workers on one accelerator: this machine's workers (LOCAL_WORLD_SIZE, set by torch
    elastic) over its CUDA devices, rounded up; 1 when nobody said."""
    local_workers = int(environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    devices = max(1, torch.cuda.device_count())
    return max(1, -(-local_workers // devices))


def memory_choice(cfg: Config, device: torch.device, environ: Mapping[str, str] | None = None) -> MemoryChoice:
    """In-flight count and activation checkpointing for this worker (noloco_rt.memory.fit):
    the budget is worker.memory_budget_gb, or the CUDA device's memory over the workers sharing it.
    A model of your own code (model.factory) is not planned: the configured in-flight count or
    the default; an hf:PATH model is, from its stages measured on fake tensors."""
    if cfg.model.factory and not cfg.model.hf_folder:
        return MemoryChoice(max_inflight=cfg.pipeline.microbatches_per_step, activation_checkpointing=False,
                            budget_bytes=None, peak_bytes=None, fits=True)
    total = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
    budget = budget_bytes(cfg.worker.memory_budget_gb, device_type=device.type, device_total_bytes=total,
                          workers_sharing=workers_sharing_device(os.environ if environ is None else environ))
    return choose(cfg, device_type="cuda" if device.type == "cuda" else "cpu", budget_bytes=budget)


def memory_fields(device: torch.device) -> dict[str, float]:
    """Peak accelerator memory allocated so far, for progress lines (nothing on CPU)."""
    if device.type != "cuda":
        return {}
    return {"gpu_peak_mib": round(torch.cuda.max_memory_allocated(device) / 2**20, 1)}


def arena_bytes(sizes: Iterable[int]) -> int:
    """The bytes a PinnedArena takes for tensors of these byte sizes, each start aligned (pure)."""
    return sum(-(-size // PinnedArena.ALIGN) * PinnedArena.ALIGN for size in sizes)


class PinnedArena:
    """One pinned host buffer, reused by each whole-state copy of one writer (one copy in use at
    a time: a busy writer skips the next): pinned once, instead of a pinned block per tensor
    that torch's caching host allocator would round up and keep. Reserved at start-up (pinning
    gigabytes takes seconds), grown to fit; a state over `limit_bytes` is not pinned at all
    (host memory is shared by the machine's workers)."""

    ALIGN = 64

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self._buffer: torch.Tensor | None = None
        self.pins = 0
        """Buffers pinned so far: one for a run whose state does not grow."""

    @property
    def reserved_bytes(self) -> int:
        return 0 if self._buffer is None else self._buffer.numel()

    def reserve(self, nbytes: int) -> bool:
        """Pin at least `nbytes` now, so that the first copy finds its buffer; False (nothing
        pinned) over limit_bytes. Needs CUDA."""
        if nbytes > self.limit_bytes:
            return False
        if self.reserved_bytes < nbytes:
            self._buffer = None  # the old one goes first: never both
            self._buffer = torch.empty(max(nbytes, 1), dtype=torch.uint8, pin_memory=True)
            self.pins += 1
        return True

    def views(self, tensors: list[torch.Tensor]) -> list[torch.Tensor] | None:
        """Contiguous host tensors shaped and typed as `tensors`, in the buffer; None when they
        need more than limit_bytes."""
        offsets, total = [], 0
        for tensor in tensors:
            offsets.append(total)
            total += arena_bytes([tensor.numel() * tensor.element_size()])
        if not self.reserve(total):
            return None
        buffer = self._buffer
        assert buffer is not None
        return [buffer[o:o + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
                for o, t in zip(offsets, tensors, strict=True)]


@dataclass(frozen=True)
class HostCopy:
    """Tensors on the host for the wire; on CUDA their copy may still be running."""

    tensors: list[torch.Tensor]
    ready: Callable[[], None] | None = None
    """Wait for this before reading `tensors` (None: they are ready)."""


class HostStaging:
    """Device <-> host copies for the wire.

    On CUDA, device-to-host copies run on a side stream into pinned memory from torch's
    caching host allocator (a freed block is reused, only once the copies that used it are
    done), and the caller gets an event to wait on instead of a synchronised copy: the
    sending thread waits for it while the training thread computes on. Nothing is cloned:
    each message owns its pinned block until ZeroMQ and the retry table let go of it.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._copy_stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def to_host(self, tensors: list[torch.Tensor], *, graph_outputs: bool = False) -> HostCopy:
        """`graph_outputs`: the tensors may be a CUDA graph's outputs (model.cuda_graphs), whose
        memory the graph's next replay overwrites whatever the side stream has still to read:
        they are copied on the current stream first (ordered before that replay), and the side
        stream reads the copies."""
        tensors = [t.detach().contiguous() for t in tensors]
        if self.device.type == "cpu":
            return HostCopy(tensors)
        if self._copy_stream is None:  # another accelerator: a plain, synchronous copy
            return HostCopy([t.to("cpu") for t in tensors])
        if graph_outputs:
            tensors = [t.clone() for t in tensors]
        side = self._copy_stream
        side.wait_stream(torch.cuda.current_stream(self.device))  # the tensors are computed
        hosts = []
        with torch.cuda.stream(side):
            for tensor in tensors:
                host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
                host.copy_(tensor, non_blocking=True)
                tensor.record_stream(side)  # its memory is not reused before the copy has read it
                hosts.append(host)
        done = torch.cuda.Event()
        done.record(side)
        return HostCopy(hosts, done.synchronize)

    def copy_live(self, tensors: list[torch.Tensor], arena: PinnedArena) -> HostCopy | None:
        """Host copies of live tensors the training thread goes on changing in place (a whole
        state for a checkpoint), without it waiting: on CUDA into `arena` on the side stream,
        and the training stream waits for those copies on the GPU, not the host, before it
        changes anything. None where this cannot be done (not CUDA, or over the arena's limit):
        the caller copies synchronously."""
        if self._copy_stream is None or (hosts := arena.views(tensors)) is None:
            return None
        side, current = self._copy_stream, torch.cuda.current_stream(self.device)
        side.wait_stream(current)  # the values of now: everything queued before is computed
        with torch.cuda.stream(side):
            for host, tensor in zip(hosts, tensors, strict=True):
                host.copy_(tensor.detach(), non_blocking=True)
        current.wait_stream(side)  # later in-place updates run once the copies have read
        done = torch.cuda.Event()
        done.record(side)
        return HostCopy(hosts, done.synchronize)

    def pinned(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` in pinned memory when it will go to a CUDA device (runs on the receiving
        thread, so the training thread only starts the copy)."""
        if self._copy_stream is None or tensor.is_pinned():
            return tensor
        return tensor.pin_memory()

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        if self._copy_stream is None:
            return tensor
        return self.pinned(tensor).to(self.device, non_blocking=True)

    def copy_to_device(self, hosts: list[torch.Tensor], like: list[torch.Tensor]) -> list[torch.Tensor]:
        """New tensors shaped, typed and placed like `like`, holding `hosts` (pinned first on
        CUDA, by the caller's background thread, for the copy not to block)."""
        if self.device.type == "cpu":
            return [host.to(target.dtype) for host, target in zip(hosts, like, strict=True)]
        return [torch.empty_like(target).copy_(host, non_blocking=self._copy_stream is not None)
                for host, target in zip(hosts, like, strict=True)]
