"""The run-finished mark: once the run is over, a worker that starts exits 0 at once.

The run is over when a worker of the last stage has finished: a later stage finishes only
after its upstream stage did (workers/finish.py), so by then every stage is done and nobody
is left downstream. A worker that starts after that (a spot replacement racing the end, a
Job's pod recreated late) would otherwise resume and train with no downstream and no end.
The mark lives in Redis and, when the run has a store, in the store too (Redis may lose it).
It holds run.steps of the finish, and counts only when that is our run.steps exactly: a run
given more steps (run.steps raised) trains on, and so does one whose mark says anything else,
since one write to Redis (a garbage or huge value) must not end every worker's start.
"""

from __future__ import annotations

from typing import Any

from noloco_rt.config.toml_out import redact_url
from noloco_rt.store.backend import RunStore, StoreError
from noloco_rt.store.run_mark import RunFinishedMark


def run_is_over(finished_steps: int | None, run_steps: int) -> bool:
    """Whether a run marked finished at `finished_steps` leaves nothing for run.steps (pure):
    the mark names exactly our run.steps (a run with more steps trains on; any other value is
    not a finish of this run's configuration)."""
    return finished_steps is not None and finished_steps == run_steps


def finished_steps(cfg: Any, membership: Any, log: Any) -> int | None:
    """run.steps of the run's finish from Redis, else from the store; None: not finished."""
    steps = membership.run_finished_steps()
    if steps is not None or not cfg.store.url:
        return steps
    try:
        return RunFinishedMark(RunStore(cfg.store.url), cfg.run.run_id).steps()
    except (OSError, StoreError) as exc:
        log.warning("store_unreadable", store=redact_url(cfg.store.url), error=str(exc))
        return None


def mark_run_finished(cfg: Any, membership: Any, *, name: str, log: Any) -> None:
    """A worker of the last stage finished: the run is over, in Redis and in the store."""
    membership.mark_run_finished(cfg.run.steps)
    if cfg.store.url:
        try:
            RunFinishedMark(RunStore(cfg.store.url), cfg.run.run_id).write(cfg.run.steps, by=name)
        except Exception as exc:  # noqa: BLE001 - the Redis mark and our checkpoint still stand
            log.warning("store_write_failed", what="run-finished mark", error=str(exc))
    log.info("run_marked_finished", steps=cfg.run.steps)
