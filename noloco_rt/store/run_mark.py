"""The run-finished mark in the durable store: `<run_id>/finished.json`.

Redis holds the same mark (membership.table), but Redis may lose its data; a pod that
comes back after the run finished must still learn that there is nothing left to train.
"""

from __future__ import annotations

import json
import time

from noloco_rt.store.backend import RunStore


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
