"""What `noloco-rt status` shows, apart from how: one row per member, as text or JSON.

Three renderings of the same rows: a rich table on a terminal, a plain full-width table
off one (so `status | grep ONLINE` finds whole words, never `ON…`), and JSON lines.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from noloco_rt.membership.progress import (
    OUTER_KINDS_HEADER,
    outer_kinds_by_stage,
    outer_kinds_cell,
    outer_kinds_text,
    progress_of,
)
from noloco_rt.membership.records import MemberRecord

COLUMNS: tuple[tuple[str, str], ...] = (
    ("stage", "stage"), ("worker", "worker"), ("name", "name"), ("state", "state"),
    ("data address", "data_addr"), ("exchange address", "exchange_addr"), ("step", "inner_step"),
    ("outer step", "outer_step"), (OUTER_KINDS_HEADER, "outer_kinds"), ("ckpt failed", "checkpoint_failed"),
    ("loss", "loss"),
    ("tokens/s", "tokens_per_s"), ("queue", "queue_depth"),
    ("heartbeat age s", "heartbeat_age_s"),
)


def progress_line(marks: dict[int, tuple[int, int]]) -> str:
    """The run's progress per stage: the outer step reached, and that of its newest
    checkpoint in the durable store (what a stage whose replicas all die resumes from)."""
    if not marks:
        return ""
    return "; ".join(f"stage {stage} reached outer step {reached}, durable {durable if durable else 'none'}"
                     for stage, (reached, durable) in sorted(marks.items()))


def outer_steps_line(records: Sequence[MemberRecord]) -> str:
    """Outer steps by kind per stage, over the listed workers."""
    return "outer steps " + outer_kinds_text(outer_kinds_by_stage(records)) if records else ""


def sorted_members(records: Sequence[MemberRecord]) -> list[MemberRecord]:
    return sorted(records, key=lambda r: (r.stage, r.name, r.worker_id))


def member_json(record: MemberRecord, now: float) -> dict[str, Any]:
    """Everything the table knows about one worker, with typed values (the full worker id)."""
    return {"run_id": record.run_id, "stage": record.stage, "worker_id": record.worker_id, "name": record.name,
            "state": record.state.value, "data_addr": record.data_addr, "exchange_addr": record.exchange_addr,
            "metrics_addr": record.metrics_addr, **progress_of(record),
            "heartbeat_age_s": round(now - record.heartbeat_time, 3)}


def json_lines(records: Sequence[MemberRecord], now: float, run: RunSummary | None = None) -> str:
    """One JSON object per worker and line ("record": "worker"), then, given `run`, one for
    the run ("record": "run"): a finished run with no worker left still prints that line."""
    workers = [{"record": "worker", **member_json(r, now)} for r in sorted_members(records)]
    return "".join(json.dumps(line, separators=(",", ":")) + "\n"
                   for line in [*workers, *([run.to_json()] if run is not None else [])])


@dataclass(frozen=True)
class RunSummary:
    """One run of a Redis, as status lists it."""

    run_id: str
    workers: int
    """Listed workers (any state)."""
    stages: int
    """Stages that ever had a member."""
    finished_steps: int | None
    """run.steps of its finish; None while it trains (or never finished)."""
    marks: dict[int, tuple[int, int]]
    """stage -> (outer step reached, outer step of the newest durable checkpoint)."""

    def to_json(self) -> dict[str, Any]:
        return {"record": "run", "run_id": self.run_id, "workers": self.workers, "stages": self.stages,
                "finished": self.finished_steps is not None, "finished_steps": self.finished_steps,
                "outer_step_reached": {str(k): v[0] for k, v in sorted(self.marks.items())},
                "outer_step_durable": {str(k): v[1] for k, v in sorted(self.marks.items())}}

    @property
    def empty(self) -> bool:
        """Nothing of this run in the Redis: no worker, no stage, no mark."""
        return not (self.workers or self.stages or self.marks or self.finished_steps is not None)

    def text(self) -> str:
        state = f"finished ({self.finished_steps} steps)" if self.finished_steps is not None else "not finished"
        reached = max((v[0] for v in self.marks.values()), default=0)
        return (f"{self.run_id}: {self.stages} stage(s), {self.workers} worker(s) listed, {state}, "
                f"furthest outer step {reached}")


def runs_listing(wanted: str, runs: Sequence[RunSummary]) -> str:
    """What status prints when the run asked for is not in this Redis but others are (pure)."""
    lines = [f"run {wanted}: nothing in this Redis. Runs here:"] + [f"  {run.text()}" for run in runs]
    lines.append("Show one with --config RUN.toml (the file its workers ran with) or --set run.run_id=ID.")
    return "\n".join(lines) + "\n"


def text_row(record: MemberRecord, now: float) -> list[str]:
    loss = "-" if record.loss is None else f"{record.loss:.3f}"
    return [str(record.stage), record.worker_id[:8], record.name or "-", record.state.value, record.data_addr,
            record.exchange_addr, str(record.inner_step), str(record.outer_step),
            outer_kinds_cell(record), str(record.checkpoint_failed), loss,
            f"{record.tokens_per_s:.0f}", str(record.queue_depth), f"{now - record.heartbeat_time:.1f}"]


def plain_table(title: str, records: Sequence[MemberRecord], now: float) -> str:
    """Columns as wide as their widest cell, separated by two spaces: never truncated."""
    rows = [[header for header, _ in COLUMNS]] + [text_row(r, now) for r in sorted_members(records)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join([title, *lines]) + "\n"
