"""What `noloco-rt status` shows, apart from how: one row per member, as text or JSON.

Three renderings of the same rows: a rich table on a terminal, a plain full-width table
off one (so `status | grep ONLINE` finds whole words, never `ON…`), and JSON lines.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
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


def json_lines(records: Sequence[MemberRecord], now: float) -> str:
    """One JSON object per worker and line; nothing at all for an empty table."""
    return "".join(json.dumps(member_json(r, now), separators=(",", ":")) + "\n" for r in sorted_members(records))


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
