"""Writes that must not hold up the training thread: the worker's own checkpoint file and
its share of the durable store.

The training thread copies what is due (`detached_copy`, at an inner-step boundary, so the
copy is consistent) and hands a job to a thread of its own. One write at a time: while one
is in flight a new one is skipped and counted (`submit` returns False) rather than queued,
since each waiting job holds a whole copy of the state and the next one will be newer.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

import torch


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
