"""Writes that must not hold up the training thread: the worker's own checkpoint file and
its share of the durable store.

The training thread copies what is due (`state_to_host`, at an inner-step boundary, so the
copy is consistent; on a GPU it only starts the copy) and hands a job to a thread of its
own. One write at a time: while one is in flight a new one is skipped and counted (`submit`
returns False) rather than queued, since each waiting job holds a whole copy of the state
and the next one will be newer.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from workers.device import HostStaging, PinnedArena

PINNED_STATE_LIMIT_BYTES = 4 << 30
"""A state larger than this is copied to pageable memory on the training thread (which waits
for it) rather than pinned: each worker would pin it once more per writer."""


@dataclass(frozen=True)
class StateOnHost:
    """A state's copy on the host; on CUDA it may still be on its way."""

    value: Any
    ready: Callable[[], None] | None = None
    """Wait for this before reading `value` (None: it is ready)."""
    blocked: bool = False
    """The training thread waited for a device-to-host copy (over the pinned limit)."""

    def get(self) -> Any:
        """The state, its tensors owning their memory (writer thread: waits for the copy and
        takes its tensors out of the reused pinned buffer)."""
        if self.ready is None:
            return self.value
        self.ready()
        return tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, self.value)


def state_to_host(value: Any, staging: HostStaging | None = None, arena: PinnedArena | None = None) -> StateOnHost:
    """Training thread, between inner steps: a host copy of a state dict that the training
    thread may change right after. CUDA tensors go through `arena` on the side stream
    without the thread waiting (HostStaging.copy_live); anything else is copied at once."""
    leaves, spec = tree_flatten(value)
    on_gpu = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor) and leaf.device.type == "cuda"]
    copy = staging.copy_live([leaves[i] for i in on_gpu], arena) if on_gpu and staging and arena else None
    if copy is None:
        return StateOnHost(detached_copy(value), blocked=bool(on_gpu))
    hosts = dict(zip(on_gpu, copy.tensors, strict=True))
    leaves = [hosts[i] if i in hosts else detached_copy(leaf) for i, leaf in enumerate(leaves)]
    return StateOnHost(tree_unflatten(leaves, spec), copy.ready)


def detached_copy(value: Any) -> Any:
    """A deep copy of a state dict's tensors on the CPU, so the training thread can go on
    changing the originals while a background thread serialises the copy."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: detached_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(detached_copy(v) for v in value)
    return value


class BackgroundWriter:
    """A thread that runs one job at a time. A job that raises is handed to `on_error` (on
    the writer thread): a failed write is the caller's to count, never the thread's end."""

    def __init__(self, name: str, *, on_error: Callable[[Exception], None]) -> None:
        self.on_error = on_error
        self.skipped_busy = 0
        """Jobs not run because the previous one was still in flight."""
        self._jobs: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._idle = threading.Event()
        self._idle.set()
        self._thread = threading.Thread(target=self._drain, name=name, daemon=True)
        self._thread.start()

    def busy(self) -> bool:
        """A job is queued or running. Ask before copying the state: a busy writer skips it."""
        return not self._idle.is_set()

    def submit(self, job: Callable[[], None]) -> bool:
        """Run `job` on the writer thread; False (counted in skipped_busy) while busy. Called
        from one thread only (the training thread): busy() cannot turn true in between."""
        if self.busy() or not self._thread.is_alive():
            self.skipped_busy += 1
            return False
        self._idle.clear()
        self._jobs.put(job)
        return True

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for the job in flight; True once none is."""
        return self._idle.wait(timeout_s)

    def _drain(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                job()
            except Exception as exc:  # noqa: BLE001 - a failed write (a full disk, a store outage) must not kill training
                self.on_error(exc)
            finally:
                self._idle.set()

    def close(self, timeout_s: float = 60.0) -> None:
        """Let the job in flight finish (bounded), then stop the thread."""
        if not self._thread.is_alive():
            return
        self._jobs.put(None)
        self._thread.join(timeout_s)
