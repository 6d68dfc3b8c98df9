"""A worker's share of the run's durable state (noloco_rt.store, docs/architecture.md §5).

Every `store.every` outer steps, the stage's elected writer (the live replica with the
smallest worker id, so one per stage in a steady state; two during a view change write
distinct files, never the same one) copies its state on the training thread and writes it
from a background thread: the step never waits for the store. First-stage workers also
save their data cursor under their name. A worker that finds no live peer of its stage
resumes the stage's newest checkpoint that passes its checksum.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from noloco_rt.data import DataCursor
from noloco_rt.logs import EventLog
from noloco_rt.store.backend import RunStore, StoreError
from noloco_rt.store.cursors import DataCursors
from noloco_rt.store.stage_checkpoints import LoadedStageCheckpoint, StageCheckpoints
from workers.background_writer import (
    PINNED_STATE_LIMIT_BYTES,
    BackgroundWriter,
    detached_copy,
    state_to_host,
)
from workers.device import HostStaging, PinnedArena

__all__ = ["DurableStageState", "detached_copy", "durable_state_for", "is_elected_writer"]


def is_elected_writer(own_id: str, live_peer_ids: list[str]) -> bool:
    """The stage's writer: the smallest id among the live replicas (pure)."""
    return all(own_id < other for other in live_peer_ids if other != own_id)


class DurableStageState:
    def __init__(self, store: RunStore, *, run_id: str, stage: int, worker_id: str, name: str, every: int,
                 keep: int, log: EventLog, on_written: Callable[[int], None] = lambda outer_step: None,
                 staging: HostStaging | None = None) -> None:
        self.checkpoints = StageCheckpoints(store, run_id, keep=keep)
        self.cursors = DataCursors(store, run_id)
        self.stage, self.worker_id, self.name, self.every = stage, worker_id, name, every
        self.log = log
        self.on_written = on_written
        self.written = 0
        self.failed = 0
        self.writer = BackgroundWriter("durable-writer", on_error=self._failed)
        self.staging = staging
        """The worker's device copies (on CUDA the state's copy does not hold up training)."""
        self._arena = PinnedArena(PINNED_STATE_LIMIT_BYTES)

    def counts(self) -> dict[str, int]:
        """For the worker's summary line: stage checkpoints written, writes failed, skipped while busy."""
        return {"written": self.written, "failed": self.failed, "skipped_busy": self.writer.skipped_busy}

    # -- resume ------------------------------------------------------------------------------

    def latest(self) -> LoadedStageCheckpoint | None:
        """The stage's newest checkpoint that passes its checksum (None: none usable)."""
        try:
            loaded, problems = self.checkpoints.latest(self.stage)
        except (OSError, StoreError) as exc:
            self.log.warning("store_unreadable", store=self.checkpoints.store.shown, error=str(exc))
            return None
        for problem in problems:
            self.log.warning("store_checkpoint_skipped", reason=problem)
        return loaded

    def cursor(self) -> DataCursor | None:
        """Our data stream's cursor, saved under our name (None: none saved)."""
        try:
            cursor = self.cursors.load(self.name)
        except (OSError, StoreError) as exc:
            self.log.warning("store_unreadable", store=self.checkpoints.store.shown, error=str(exc))
            return None
        if cursor is not None:
            self.log.info("data_cursor_restored", epoch=cursor.epoch, position=cursor.position)
        return cursor

    # -- writes --------------------------------------------------------------------------------

    def after_outer_step(self, outer_step: int, inner_step: int, *, state: Callable[[], dict[str, Any]],
                         cursor: dict[str, Any] | None, live_peer_ids: list[str]) -> None:
        """On the training thread: copy what is due and hand it to the writer thread."""
        if outer_step % self.every:
            return
        write_stage = is_elected_writer(self.worker_id, live_peer_ids)
        if not write_stage and cursor is None:
            return
        if self.writer.busy():  # the store is slower than our outer steps: the next one will do
            self.writer.skipped_busy += 1
            self.log.warning("store_write_skipped", outer_step=outer_step, note="previous write still running")
            return
        snapshot = state_to_host(state(), self.staging, self._arena) if write_stage else None

        def job() -> None:
            if snapshot is not None:
                self._write_stage(snapshot.get(), outer_step, inner_step)
            if cursor is not None:
                self.cursors.save(self.name, cursor, inner_step=inner_step)
        self.writer.submit(job)

    def write_now(self, outer_step: int, inner_step: int, *, state: dict[str, Any] | None,
                  cursor: dict[str, Any] | None, wait_s: float = 60.0) -> None:
        """Finishing or leaving: wait up to `wait_s` for a queued write, then write these in
        the caller's thread."""
        self.close(wait_s)
        try:
            if state is not None:
                self._write_stage(state, outer_step, inner_step)
            if cursor is not None:
                self.cursors.save(self.name, cursor, inner_step=inner_step)
        except Exception as exc:  # noqa: BLE001 - never let a store failure lose the local checkpoint
            self._failed(exc)

    def _write_stage(self, state: dict[str, Any], outer_step: int, inner_step: int) -> None:
        info = self.checkpoints.save(self.stage, state, outer_step=outer_step, inner_step=inner_step,
                                     writer=self.worker_id)
        self.written += 1
        self.log.info("store_checkpoint_written", outer_step=outer_step, sha256=info.sha256[:16], bytes=info.size)
        self.on_written(outer_step)

    def _failed(self, exc: Exception) -> None:
        """A write that raised (a store outage, a full disk): counted; training goes on."""
        self.failed += 1
        self.log.warning("store_write_failed", error=str(exc), error_type=type(exc).__name__)

    def close(self, timeout_s: float = 60.0) -> None:
        """Let the queued write finish (bounded), then stop the writer thread."""
        self.writer.close(timeout_s)


def durable_state_for(cfg: Any, stage: int, *, worker_id: str, name: str, log: EventLog,
                      membership: Any, staging: HostStaging | None = None) -> DurableStageState | None:
    """The worker's durable state when the run has a store (store.url), else None."""
    if not cfg.store.url:
        return None
    return DurableStageState(RunStore(cfg.store.url), run_id=cfg.run.run_id, stage=stage, worker_id=worker_id,
                             name=name, every=cfg.store.every, keep=cfg.store.keep, log=log,
                             on_written=lambda step: membership.high_water.record_durable(stage, step),
                             staging=staging)
