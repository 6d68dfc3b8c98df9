"""What a worker publishes about its progress, besides liveness: one list of fields.

The membership record carries these fields (as Redis hash fields of the same names),
`noloco-rt up` shows them per worker, `noloco-rt status` prints some. Peers route on
queue_depth alone; the rest is for people watching.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

OUTER_STEP_KINDS = ("matched", "partial", "local", "dropped_late", "failed")
"""What became of an outer step, one word everywhere (logs, metrics, status, `up`):
matched, every computed partner's state used; partial, some; local, none (no partner's
push, or no partner); dropped_late, a correction later than outer.max_delay_steps;
failed, the round raised (a bug: the step stayed local)."""

_REQUIRED = {"required": True}
"""Marks a field every member record must hold (the rest may be missing: defaults apply)."""


@dataclass(frozen=True, kw_only=True)
class WorkerProgress:
    outer_step: int = field(default=0, metadata=_REQUIRED)
    queue_depth: int = field(default=0, metadata=_REQUIRED)
    """Forwards waiting or in flight at the worker: the routing hint."""
    inner_step: int = 0
    """The worker's inner steps; for stage 0 its clock (the inner steps a pull skipped count:
    what run.steps is measured against)."""
    loss: float | None = None
    """Mean training loss of the last inner step (stages that compute the loss)."""
    tokens_per_s: float = 0.0
    outer_matched: int = 0
    outer_partial: int = 0
    outer_local: int = 0
    outer_dropped_late: int = 0
    outer_failed: int = 0
    """Outer steps by kind (OUTER_STEP_KINDS), as `outer_<kind>`."""
    retried: int = 0
    dropped: int = 0
    checkpoint_failed: int = 0
    """Writes of the worker's own checkpoint that failed (a full disk...); it trained on."""


_PARSERS = {"int": int, "float": float, "float | None": float}


def progress_of(source: Any) -> dict[str, Any]:
    """The progress fields of `source` (a WorkerProgress or anything holding them), by name."""
    return {f.name: getattr(source, f.name) for f in fields(WorkerProgress)}


def outer_kind_counts(source: Any) -> dict[str, int]:
    """Outer steps by kind of `source` (a WorkerProgress or anything holding its fields)."""
    return {kind: int(getattr(source, f"outer_{kind}", 0)) for kind in OUTER_STEP_KINDS}


OUTER_KINDS_HEADER = "matched/partial/local/late/failed"
"""The column heading of `outer_kinds_cell` in `up`'s and `status`'s tables."""


def outer_kinds_cell(source: Any) -> str:
    """A worker's outer steps by kind, in OUTER_STEP_KINDS order, for a table cell: "7/0/1/0/0"."""
    return "/".join(str(count) for count in outer_kind_counts(source).values())


def outer_kind_fields(counts: dict[str, int]) -> dict[str, int]:
    """The WorkerProgress fields of outer steps counted by kind."""
    return {f"outer_{kind}": int(counts.get(kind, 0)) for kind in OUTER_STEP_KINDS}


def outer_kinds_by_stage(rows: Iterable[Any]) -> dict[int, dict[str, int]]:
    """Outer steps by kind, summed per stage over `rows` (anything with a `stage` and the
    progress fields: member records, `up`'s worker rows)."""
    totals: dict[int, dict[str, int]] = {}
    for row in rows:
        stage = totals.setdefault(int(row.stage), dict.fromkeys(OUTER_STEP_KINDS, 0))
        for kind, count in outer_kind_counts(row).items():
            stage[kind] += count
    return dict(sorted(totals.items()))


def outer_kinds_text(by_stage: dict[int, dict[str, int]]) -> str:
    """One line: "stage 0: 78 of 80 matched, 0 partial, 2 local, 0 dropped_late, 0 failed; stage 1: ..."."""
    parts = []
    for stage, counts in sorted(by_stage.items()):
        rest = ", ".join(f"{counts.get(kind, 0)} {kind}" for kind in OUTER_STEP_KINDS[1:])
        parts.append(f"stage {stage}: {counts.get('matched', 0)} of {sum(counts.values())} matched, {rest}")
    return "; ".join(parts) if parts else "no outer step yet"


def progress_to_text(progress: WorkerProgress) -> dict[str, str]:
    """Redis hash fields: str() of each value ("" for no loss)."""
    return {name: "" if value is None else str(value) for name, value in progress_of(progress).items()}


def progress_from_text(text: dict[str, str]) -> dict[str, Any]:
    """Parsed progress fields; raises KeyError for a missing required one, ValueError if malformed."""
    values: dict[str, Any] = {}
    for f in fields(WorkerProgress):
        raw = text[f.name] if f.metadata.get("required") else text.get(f.name)
        values[f.name] = _PARSERS[str(f.type)](raw) if f.metadata.get("required") or raw else f.default
    return values
