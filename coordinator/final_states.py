"""The end of a run, as the coordinator finds it: every replica's final state, read once the
run-finished mark is up and no worker is left (docs/architecture.md §8, "The end of a run").

From the durable store (each stage's checkpoints of its newest outer step: every replica writes
its final state there before it marks its stage finished) or, without a store, from this
machine's checkpoint folder (`up`, or every stage launched beside the coordinator).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from noloco_rt.config import Config
from noloco_rt.config.redaction import redact_url
from noloco_rt.consensus.scored import (
    WorkerCheckpoints,
    read_store_checkpoints,
    read_worker_checkpoints,
)
from noloco_rt.logs import EventLog
from noloco_rt.membership.table import Membership
from noloco_rt.store.backend import StoreError

FINISH_CHECK_S = 2.0
"""How often the coordinator looks for the run-finished mark (and, after it, for the final states)."""
FINAL_STATES_WAIT_S = 60.0
"""After the mark: how long the final states may take to appear (a stage's workers write
theirs before its finished mark, so normally they are there)."""


class FinalStates:
    def __init__(self, cfg: Config, membership: Membership, log: EventLog) -> None:
        self.cfg = cfg
        self.membership = membership
        self.log = log

    def _read(self) -> WorkerCheckpoints | None:
        """The store's final states; without a store, the workers' checkpoints in this machine's
        checkpoint folder (all of a run's workers here: `up`, or `launch` of every stage on one
        node beside the coordinator); None when neither can be read."""
        if not self.cfg.store.url:
            folder = self._checkpoint_folder()
            return read_worker_checkpoints(folder, self.cfg) if folder.is_dir() else None
        try:
            return read_store_checkpoints(self.cfg)
        except (OSError, StoreError) as exc:
            self.log.warning("store_unreadable", store=redact_url(self.cfg.store.url), error=str(exc))
            return None

    def _checkpoint_folder(self) -> Path:
        return Path(self.cfg.paths.checkpoint_dir or Path(self.cfg.paths.out_dir) / "checkpoints")

    def wait(self, stop: threading.Event) -> WorkerCheckpoints | None:
        """Every replica's final state in the store (each stage's checkpoints of its newest outer
        step), once no worker of the run is left (the last stage's other replicas may still be
        writing theirs when the first marks the run finished) and stage 0's hold run.steps;
        None when that does not come within FINAL_STATES_WAIT_S (or the store cannot be read)."""
        if not self.cfg.store.url and not self._checkpoint_folder().is_dir():
            return None  # nowhere to find them: the workers ran on other machines
        deadline = time.monotonic() + FINAL_STATES_WAIT_S
        while True:
            settled = not self.membership.live_members(stage=None, states=None) or time.monotonic() >= deadline
            found = self._read() if settled else None
            if found is not None and not found.missing_stages() \
                    and min(found.inner_steps_by_stage[0]) >= self.cfg.run.steps:
                return found
            if time.monotonic() >= deadline or stop.wait(FINISH_CHECK_S):
                return None
