"""The run-finished mark in the durable store: `<run_id>/finished.json`, and how a process
reads the run's finish (Redis first, then the store).

Redis holds the same mark (membership.table), but Redis may lose its data; a pod that
comes back after the run finished must still learn that there is nothing left to train.
The mark holds run.steps of the finish, and counts only when that is our run.steps exactly:
a run given more steps (run.steps raised) trains on, and so does one whose mark says anything
else, since one write to Redis (a garbage or huge value) must not end every worker's start.
"""

from __future__ import annotations

import json
import time
from typing import Any

from noloco_rt.config.redaction import redact_url
from noloco_rt.logs import EventLog
from noloco_rt.store.backend import RunStore, StoreError


def run_is_over(finished_steps: int | None, run_steps: int) -> bool:
    """Whether a run marked finished at `finished_steps` leaves nothing for run.steps (pure):
    the mark names exactly our run.steps (a run with more steps trains on; any other value is
    not a finish of this run's configuration)."""
    return finished_steps is not None and finished_steps == run_steps


def finished_steps(cfg: Any, membership: Any, log: EventLog) -> int | None:
    """run.steps of the run's finish from Redis, else from the store; None: not finished."""
    steps = membership.run_finished_steps()
    if steps is not None or not cfg.store.url:
        return steps
    try:
        return RunFinishedMark(RunStore(cfg.store.url), cfg.run.run_id).steps()
    except (OSError, StoreError) as exc:
        log.warning("store_unreadable", store=redact_url(cfg.store.url), error=str(exc))
        return None


class RunFinishedMark:
    def __init__(self, store: RunStore, run_id: str) -> None:
        self.store = store
        self.path = f"{run_id}/finished.json"

    def write(self, steps: int, *, by: str) -> None:
        self.store.write(self.path, json.dumps({"steps": steps, "by": by, "time": time.time()}).encode())

    def steps(self) -> int | None:
        """run.steps of the run's finish; None if it has not finished (or the mark is unreadable)."""
        try:
            steps = json.loads(self.store.read(self.path))["steps"]
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return None
        return steps if isinstance(steps, int) else None
