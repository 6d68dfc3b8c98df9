"""Writes of a worker's own checkpoint file (docs/architecture.md §5): off the training
thread while it trains, in the caller's thread when it finishes or leaves; the last
worker.checkpoint_keep kept (noloco_rt.checkpoints.kept).

A write that fails (a full disk, an I/O error, a read-only or forbidden folder) is logged
as `checkpoint_failed`, counted by its errno name and never raised: the worker trains on,
and its last good checkpoint stays where it was (the failed write removed its temporary).
"""

from __future__ import annotations

import collections
import errno
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from noloco_rt.checkpoints.kept import write_kept
from noloco_rt.checkpoints.worker import checkpoint_writer
from noloco_rt.logs import EventLog
from workers.background_writer import PINNED_STATE_LIMIT_BYTES, BackgroundWriter, state_to_host
from workers.device import HostStaging, PinnedArena


def checkpoint_due(outer_step: int, *, every: int, interval_s: float, since_write_s: float) -> bool:
    """Whether the outer step just taken calls for a checkpoint: every `every` outer steps
    (0: never by count), or once `interval_s` passed since the last completed write (0: never
    by time). Pure."""
    by_count = every > 0 and outer_step % every == 0
    by_time = interval_s > 0 and since_write_s >= interval_s
    return by_count or by_time


def failure_kind(exc: BaseException) -> str:
    """How a failed write is counted: the errno's name (ENOSPC, EIO, EROFS, EACCES...), else
    the exception's type. Pure."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return errno.errorcode.get(exc.errno, f"errno{exc.errno}")
    return type(exc).__name__


class CheckpointWrites:
    """One worker's checkpoint file, written whole or not at all, one write at a time."""

    def __init__(self, path: Path, *, keep: int, log: EventLog, failures_metric: Any = None,
                 fault: Callable[[], None] | None = None, clock: Callable[[], float] = time.monotonic,
                 staging: HostStaging | None = None) -> None:
        self.path, self.keep, self.log = path, keep, log
        self.staging = staging
        """The worker's device copies (on CUDA the state's copy does not hold up training)."""
        self._arena = PinnedArena(PINNED_STATE_LIMIT_BYTES)
        self._said_blocking = False
        self.failures_metric = failures_metric
        """Prometheus counter labelled by kind (noloco_checkpoint_failures_total), or None."""
        self.fault = fault
        """Tests only: a write call that raises (workers.faults.checkpoint_writes)."""
        self.clock = clock
        self.written = 0
        self.last_written: tuple[int, int] | None = None
        """(outer step, inner step) of the newest checkpoint on disk written by this incarnation."""
        self._failures: collections.Counter[str] = collections.Counter()
        self._write_lock = threading.Lock()
        """One write of the file at a time."""
        self._counts_lock = threading.Lock()
        """Guards the counts, which the heartbeat thread reads: never held during I/O."""
        self._last_write_at = clock()
        """The time cadence counts from the start of the incarnation until a first write."""
        self.writer = BackgroundWriter("checkpoint-writer", on_error=self._unexpected)

    # -- what the worker reports ----------------------------------------------------------

    def seconds_since_write(self) -> float:
        with self._counts_lock:
            return self.clock() - self._last_write_at

    def failed_total(self) -> int:
        with self._counts_lock:
            return sum(self._failures.values())

    def counts(self) -> dict[str, Any]:
        """For the worker's summary line: written, failed by kind, skipped while busy."""
        with self._counts_lock:
            return {"written": self.written, "failed": dict(self._failures), "skipped_busy": self.writer.skipped_busy}

    # -- writes ---------------------------------------------------------------------------

    def reserve_pinned(self, nbytes: int) -> bool:
        """Start-up, on CUDA: pin the buffer the state's copies go through now (pinning
        gigabytes takes seconds), not at the first checkpoint, when the training thread would
        wait for it. False where nothing is pinned (not CUDA, or over the pinned limit)."""
        if self.staging is None or self.staging.device.type != "cuda":
            return False
        return self._arena.reserve(nbytes)

    def in_background(self, state: Callable[[], dict[str, Any]], *, reason: str, outer_step: int,
                      inner_step: int) -> bool:
        """On the training thread, between inner steps: copy the state and hand it to the
        writer thread. False when the previous write is still running (skipped, counted)."""
        if self.writer.busy():
            self.writer.skipped_busy += 1
            self.log.info("checkpoint_skipped", outer_step=outer_step, note="previous checkpoint write still running")
            return False
        snapshot = state_to_host(state(), self.staging, self._arena)
        if snapshot.blocked and not self._said_blocking:
            self._said_blocking = True
            self.log.info("checkpoint_copy_blocking", limit_bytes=PINNED_STATE_LIMIT_BYTES,
                          note="the state is over the pinned limit: the training thread waits for its copy")
        return self.writer.submit(lambda: self._write(snapshot.get(), reason=reason, outer_step=outer_step,
                                                      inner_step=inner_step))

    def now(self, state: dict[str, Any], *, reason: str, outer_step: int, inner_step: int,
            wait_s: float = 600.0) -> bool:
        """In the caller's thread (finishing, leaving), once the write in flight is done (up to
        `wait_s`; a write past that still finishes first, and is older, so it cannot replace
        this one). True when written."""
        self.writer.wait_idle(wait_s)
        return self._write(state, reason=reason, outer_step=outer_step, inner_step=inner_step)

    def _write(self, state: dict[str, Any], *, reason: str, outer_step: int, inner_step: int) -> bool:
        with self._write_lock:
            if self.last_written is not None and (outer_step, inner_step) < self.last_written:
                self.log.info("checkpoint_superseded", outer_step=outer_step, inner_step=inner_step)
                return False
            try:
                write_kept(self.path, checkpoint_writer(state), keep=self.keep, fault=self.fault)
                size = self.path.stat().st_size  # ours: writes of this file hold the lock
            except OSError as exc:
                self._count_failure(exc, reason=reason, outer_step=outer_step)
                return False
            with self._counts_lock:
                self.written += 1
                self.last_written = (outer_step, inner_step)
                self._last_write_at = self.clock()
            # Logged under the write lock: the log's order is the order of the writes.
            self.log.info("checkpoint_written", reason=reason, path=str(self.path), inner_step=inner_step,
                          outer_step=outer_step, bytes=size)
        return True

    def _count_failure(self, exc: BaseException, *, reason: str, outer_step: int | None) -> None:
        """One failed write: counted, logged, exported."""
        kind = failure_kind(exc)
        with self._counts_lock:
            self._failures[kind] += 1
            failed = sum(self._failures.values())
        if self.failures_metric is not None:
            self.failures_metric.labels(kind=kind).inc()
        message = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        self.log.warning("checkpoint_failed", kind=kind, error=message, path=str(self.path), reason=reason,
                         outer_step=outer_step, failed=failed,
                         last_good=list(self.last_written) if self.last_written else None,
                         note="training goes on; the last good checkpoint is kept")

    def _unexpected(self, exc: Exception) -> None:
        """A background write that raised something other than OSError (e.g. serialising)."""
        self._count_failure(exc, reason="periodic", outer_step=None)

    def close(self, timeout_s: float = 60.0) -> None:
        """Let the write in flight finish (bounded), then stop the writer thread."""
        self.writer.close(timeout_s)
