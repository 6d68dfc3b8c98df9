"""A worker's state across incarnations: checkpoints written and resumed, or a peer's state
downloaded (docs/architecture.md §5: resume our own checkpoint, else bootstrap from a peer, else start
from the run seed as the first of the stage)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from noloco_rt.algo.replica import StageReplica
from noloco_rt.checkpoints.kept import load_newest_usable
from noloco_rt.data import DataCursor
from noloco_rt.logs import EventLog
from workers.background_writer import detached_copy
from workers.checkpoint_writes import CheckpointWrites
from workers.counters import Counters
from workers.device import arena_bytes


class WorkerCheckpoint:
    """This worker's checkpoint file: replica, inner optimizer, counters and data cursor."""

    def __init__(self, path: Path, *, run_id: str, stage: int, name: str, replica: StageReplica,
                 counters: Counters, cursor_state: Callable[[], dict[str, Any] | None], h: int, log: EventLog,
                 writes: CheckpointWrites | None = None) -> None:
        self.path = path
        self.h = h
        """Inner steps per outer step: a restored clock is at least at the outer step reached."""
        self.run_id = run_id
        self.stage = stage
        self.name = name
        self.replica = replica
        self.counters = counters
        self.cursor_state = cursor_state
        self.log = log
        self.writes = writes if writes is not None else CheckpointWrites(path, keep=1, log=log)

    def state_dict(self) -> dict[str, Any]:
        """The live state (tensors where they train): copy it (`snapshot`) before the training
        thread goes on."""
        replica = self.replica
        return {
            "run_id": self.run_id, "stage": self.stage, "name": self.name,
            "slow": list(replica.slow), "fast": list(replica.fast), "momentum": list(replica.momentum),
            "inner_optimizer": replica.inner.state_dict(),
            "counters": {"inner_steps": self.counters.inner_steps, "outer_steps": self.counters.outer_steps,
                         "clock_steps": self.counters.clock_steps},
            "cursor": self.cursor_state(),
            # What our sparse rounds have not sent yet (worker.delta_codec): restored only into
            # this worker (its name), never into another replica resuming from the store.
            "error_feedback": replica.error_feedback.state_dict(),
        }

    def pinned_state_bytes(self) -> int:
        """The pinned bytes a copy of our whole state takes (PinnedArena), counted before the
        first inner step too: the state's tensors now, plus AdamW's two moments and step count
        for each parameter that has none yet (they appear at its first step)."""
        leaves, _ = tree_flatten(self.state_dict())
        sizes = [leaf.numel() * leaf.element_size() for leaf in leaves if isinstance(leaf, torch.Tensor)]
        optimizer = self.replica.inner.optimizer
        for param in self.replica.inner.params:
            if not optimizer.state.get(param):
                size = param.numel() * param.element_size()
                sizes += [size, size, torch.tensor(0.0).element_size()]  # exp_avg, exp_avg_sq, step
        return arena_bytes(sizes)

    def snapshot(self) -> dict[str, Any]:
        """The state copied to the CPU, independent of training from here on."""
        return detached_copy(self.state_dict())

    def save_in_background(self, reason: str) -> bool:
        """Copy the state now (between inner steps: consistent) and write it off the training
        thread; False when skipped (the previous write still runs)."""
        return self.writes.in_background(self.state_dict, reason=reason, outer_step=self.counters.outer_steps,
                                         inner_step=self.counters.inner_steps)

    def save(self, reason: str) -> bool:
        """Write now, in this thread, after any write in flight (finishing, leaving). A failed
        write is counted and logged, not raised; True when written."""
        return self.writes.now(self.snapshot(), reason=reason, outer_step=self.counters.outer_steps,
                               inner_step=self.counters.inner_steps)

    def resume(self) -> tuple[bool, DataCursor | None]:
        """(whether a checkpoint of this run and stage was loaded, its data cursor). The newest
        kept one that loads; older ones when it cannot be read (a warning says why)."""
        state, used, passed_over = load_newest_usable(self.path, keep=self.writes.keep, run_id=self.run_id,
                                                      stage=self.stage)
        for problem in passed_over:
            self.log.warning("checkpoint_passed_over", reason=problem, note="resuming from an older kept checkpoint")
        if state is None:
            return False, None
        cursor = self.apply(state)
        self.log.info("resumed_checkpoint", path=str(used), inner_step=self.counters.inner_steps,
                      outer_step=self.counters.outer_steps)
        return True, cursor

    def apply(self, state: dict[str, Any]) -> DataCursor | None:
        """Load a checkpoint's state (ours, or the stage's from the durable store); returns
        its data cursor."""
        self.replica.load_weights(slow=state["slow"], fast=state["fast"], momentum=state["momentum"])
        self.replica.inner.load_state_dict(state["inner_optimizer"])
        counters = state["counters"]
        clock = counters.get("clock_steps")  # absent from checkpoints written before pulls
        self.counters.set_steps(int(counters["inner_steps"]), int(counters["outer_steps"]), h=self.h,
                                clock_steps=None if clock is None else int(clock))
        if state.get("name") == self.name:
            self.replica.error_feedback.load_state_dict(state.get("error_feedback"), like=self.replica.slow)
        return DataCursor.from_state_dict(state["cursor"]) if state.get("cursor") else None


class AliveFile:
    """A file whose modification time says the training loop still turns (worker.alive_file):
    a liveness probe that finds it stale knows the loop hung. Touched at most once a second."""

    def __init__(self, path: str, *, every_s: float = 1.0) -> None:
        self.path = path
        self.every_s = every_s
        self._last = float("-inf")

    def touch(self) -> None:
        if not self.path:
            return
        now = time.monotonic()
        if now - self._last < self.every_s:
            return
        self._last = now
        try:
            with open(self.path, "a"):
                os.utime(self.path)
        except OSError:
            pass  # an unwritable path only makes the probe fail, which says what is wrong
