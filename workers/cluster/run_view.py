"""What `noloco-rt up` shows and records: one sample of the run, as a table or a log line.

Pure: a sample is built from the supervisor's process table, the membership records
and the coordinator's last status; rendering it needs no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.table import Table

from noloco_rt.membership.progress import (
    OUTER_KINDS_HEADER,
    WorkerProgress,
    outer_kinds_by_stage,
    outer_kinds_cell,
    progress_of,
)
from noloco_rt.membership.records import MemberRecord


@dataclass(frozen=True)
class WorkerRow(WorkerProgress):
    """One worker name: its progress fields (the newest membership record's) plus what the
    supervisor knows."""

    name: str
    stage: int
    state: str
    """Membership state while running (JOINING, ONLINE), else the supervisor's (finished, backoff...)."""
    restarts: int = 0


@dataclass
class RunSample:
    time: float
    elapsed_s: float
    steps: int
    workers: list[WorkerRow]
    val_loss: float | None = None
    eval_step: int | None = None
    spread: float | None = None
    coordinator: str = "off"
    redis: str = "up"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def progress(self) -> float:
        """Fraction of the run done: mean over workers of inner_step / steps."""
        if not self.workers or not self.steps:
            return 0.0
        return min(1.0, sum(min(w.inner_step, self.steps) for w in self.workers) / (len(self.workers) * self.steps))

    @property
    def remaining_s(self) -> float | None:
        progress = self.progress
        if progress <= 0.0 or progress >= 1.0:
            return None if progress <= 0.0 else 0.0
        return self.elapsed_s * (1.0 - progress) / progress

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["kind"] = "workers"
        data["progress"] = round(self.progress, 4)
        return data


def build_sample(*, now: float, started: float, steps: int, names_by_stage: Mapping[str, int],
                 processes: Mapping[str, Any], records: Sequence[MemberRecord],
                 last_seen: dict[str, WorkerRow], coordinator_status: Mapping[str, Any] | None,
                 coordinator_state: str, redis_up: bool) -> RunSample:
    """One row per worker name. `processes` maps name -> the supervisor's status (state,
    restarts); the newest membership record of that name fills in the progress; a worker
    that left the table keeps its last seen figures (`last_seen` is updated in place)."""
    by_name: dict[str, MemberRecord] = {}
    for record in records:
        if record.name and (record.name not in by_name or record.heartbeat_time > by_name[record.name].heartbeat_time):
            by_name[record.name] = record
    rows = []
    for name, stage in names_by_stage.items():
        process = processes.get(name)
        process_state = getattr(process, "state", "unknown")
        restarts = int(getattr(process, "restarts", 0))
        record = by_name.get(name)
        previous = last_seen.get(name)
        if record is not None:
            progress = progress_of(record)
        else:  # a worker that left the table keeps its last figures, but no longer a rate
            progress = {**(progress_of(previous) if previous else {}), "tokens_per_s": 0.0}
        row = WorkerRow(name=name, stage=stage, restarts=restarts,
                        state=_row_state(process_state, record, previous, restarts), **progress)
        last_seen[name] = row
        rows.append(row)
    sample = RunSample(time=now, elapsed_s=now - started, steps=steps, workers=rows,
                       coordinator=coordinator_state, redis="up" if redis_up else "unreachable")
    if coordinator_status:
        last_eval = coordinator_status.get("last_eval") or {}
        last_spread = coordinator_status.get("last_spread") or {}
        sample.val_loss = last_eval.get("val_loss")
        sample.eval_step = last_eval.get("step")
        sample.spread = last_spread.get("spread")
    return sample


def _row_state(process_state: str, record: MemberRecord | None, previous: WorkerRow | None, restarts: int) -> str:
    """The supervisor's state once the process stopped; else the membership state."""
    if process_state in ("finished", "failed", "backoff", "stopped"):
        return process_state
    if record is not None:
        return record.state.value
    if process_state != "running":
        return process_state
    # Running but not in the table: not registered yet, or already gone from it.
    return ("leaving" if previous is not None and previous.restarts == restarts
            and previous.state in ("ONLINE", "LEAVING", "leaving") else "starting")


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"


def headline(sample: RunSample) -> str:
    return (f"{sample.progress:6.1%} elapsed {_duration(sample.elapsed_s)} remaining {_duration(sample.remaining_s)}"
            f" | val loss {_fmt(sample.val_loss, '.3f')} (step {sample.eval_step if sample.eval_step is not None else '-'})"
            f" spread {_fmt(sample.spread, '.2e')} | coordinator {sample.coordinator} | redis {sample.redis}")


def render_table(sample: RunSample, *, title: str) -> Table:
    table = Table(title=title, caption=headline(sample), caption_justify="left")
    for column, justify in (("stage", "right"), ("worker", "left"), ("state", "left"), ("step", "right"),
                            ("loss", "right"), ("tokens/s", "right"), ("outer", "right"),
                            (OUTER_KINDS_HEADER, "right"), ("retried", "right"), ("dropped", "right"),
                            ("ckpt failed", "right"), ("restarts", "right")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for row in sorted(sample.workers, key=lambda r: (r.stage, r.name)):
        table.add_row(str(row.stage), row.name, row.state, f"{row.inner_step}/{sample.steps}",
                      _fmt(row.loss, ".3f"), _fmt(row.tokens_per_s, ".0f"), str(row.outer_step),
                      outer_kinds_cell(row), str(row.retried), str(row.dropped),
                      str(row.checkpoint_failed), str(row.restarts))
    return table


def log_fields(sample: RunSample) -> dict[str, Any]:
    """The same sample as flat fields for one plain log line (off a terminal)."""
    losses = [w.loss for w in sample.workers if w.loss is not None]
    states: dict[str, int] = {}
    for w in sample.workers:
        states[w.state] = states.get(w.state, 0) + 1
    return {"progress": f"{sample.progress:.1%}", "elapsed_s": round(sample.elapsed_s, 1),
            "remaining_s": None if sample.remaining_s is None else round(sample.remaining_s),
            "min_step": min((w.inner_step for w in sample.workers), default=0),
            "train_loss": round(sum(losses) / len(losses), 4) if losses else None,
            "tokens_per_s": round(sum(w.tokens_per_s for w in sample.workers if w.stage == 0)),
            "outer_steps": {str(stage): counts for stage, counts in outer_kinds_by_stage(sample.workers).items()},
            "retried": sum(w.retried for w in sample.workers), "dropped": sum(w.dropped for w in sample.workers),
            "checkpoint_failed": sum(w.checkpoint_failed for w in sample.workers),
            "restarts": sum(w.restarts for w in sample.workers), "states": states,
            "val_loss": sample.val_loss, "spread": sample.spread, "coordinator": sample.coordinator,
            "redis": sample.redis}
