"""The run-finished mark: once the run is over, a worker that starts exits 0 at once.

The run is over when a worker of the last stage has finished: a later stage finishes only
after its upstream stage did (workers/finish.py), so by then every stage is done and nobody
is left downstream. A worker that starts after that (a spot replacement racing the end, a
Job's pod recreated late) would otherwise resume and train with no downstream and no end.
The mark lives in Redis and, when the run has a store, in the store too (Redis may lose it);
how it is read, and why it counts only when it names our run.steps: noloco_rt.store.run_mark.
"""

from __future__ import annotations

from typing import Any

from noloco_rt.logs import EventLog
from noloco_rt.store.backend import RunStore
from noloco_rt.store.run_mark import RunFinishedMark, finished_steps, run_is_over

__all__ = ["finished_steps", "mark_run_finished", "run_is_over"]


def mark_run_finished(cfg: Any, membership: Any, *, name: str, log: EventLog) -> None:
    """A worker of the last stage finished: the run is over, in Redis and in the store."""
    membership.mark_run_finished(cfg.run.steps)
    if cfg.store.url:
        try:
            RunFinishedMark(RunStore(cfg.store.url), cfg.run.run_id).write(cfg.run.steps, by=name)
        except Exception as exc:  # noqa: BLE001 - the Redis mark and our checkpoint still stand
            log.warning("store_write_failed", what="run-finished mark", error=str(exc))
    log.info("run_marked_finished", steps=cfg.run.steps)
