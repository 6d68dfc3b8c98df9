"""What the chaos driver knows of the workers, followed from their JSON logs as they grow:
who is online, the step each has reached, who has finished, when training began, and the
latest wall time a worker re-registered or a checkpoint write met a full disk."""

from __future__ import annotations

import time
from pathlib import Path

from noloco_rt.logs import read_json_lines
from workers.cluster.chaos_report import FOUND_RUN_FINISHED, event_time


class WorkerLogFollower:
    """Reads every `<name>.<incarnation>.log` in a folder from where it left off."""

    def __init__(self, log_dir: Path, target_steps: int) -> None:
        self.log_dir = log_dir
        self.target_steps = target_steps
        self.tails: dict[Path, int] = {}
        self.reached: dict[str, int] = {}
        """The run's step each worker is at (its data's clock on a later stage)."""
        self.online: set[tuple[str, int]] = set()
        self.steps_done: set[tuple[str, int]] = set()
        """Incarnations that logged their steps done: finishing, a fault there would not be seen."""
        self.train_started: float | None = None
        """Monotonic time of the first train_progress: the schedule's clock starts with training."""
        self.reregistered_at: float | None = None
        """Wall time of the latest member_reregistered (after a Redis that lost its data)."""
        self.write_failed_at: float | None = None
        """Wall time of the latest checkpoint write that failed with ENOSPC (a full disk met)."""

    def read(self) -> None:
        for path in self.log_dir.glob("*.log"):
            records, self.tails[path] = read_json_lines(path, self.tails.get(path, 0))
            name, _, incarnation = path.name[:-len(".log")].rpartition(".")
            for record in records:
                self._follow(name, int(incarnation), record)

    def _follow(self, name: str, incarnation: int, record: dict) -> None:
        event = record.get("event")
        if event in ("member_online", FOUND_RUN_FINISHED):  # the latter: back, nothing to rejoin
            self.online.add((name, incarnation))
        at = event_time(record)
        if event == "member_reregistered" and at is not None:
            self.reregistered_at = max(at, self.reregistered_at or at)
        if event == "checkpoint_failed" and record.get("kind") == "ENOSPC" and at is not None:
            self.write_failed_at = max(at, self.write_failed_at or at)
        # A later stage's worker restarted a few times trains fewer inner steps than its data's clock has advanced.
        step = record.get("clock_step", record.get("inner_step"))
        if isinstance(step, int) and event in ("train_progress", "steps_done", "checkpoint_written"):
            self.reached[name] = max(self.reached.get(name, 0), step)
        if event == "steps_done":  # done by its clock: a pulled stage-0 worker skipped inner steps
            self.reached[name] = max(self.reached.get(name, 0), self.target_steps)
            self.steps_done.add((name, incarnation))
        if event == "train_progress" and self.train_started is None:
            self.train_started = time.monotonic()

    def all_reached(self, names: list[str]) -> bool:
        return all(self.reached.get(name, 0) >= self.target_steps for name in names)

    def reregistered_since(self, wall: float) -> bool:
        return self.reregistered_at is not None and self.reregistered_at >= wall

    def write_failed_since(self, wall: float) -> bool:
        return self.write_failed_at is not None and self.write_failed_at >= wall
