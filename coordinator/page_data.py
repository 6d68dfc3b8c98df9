"""What the live page shows, from the membership records: per-stage aggregates (so 1,000
workers stay one row per stage), one stage's workers on demand, and what changed between two
readings (arrivals, departures, restarts, checkpoint failures). Pure: no I/O, no clock."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from noloco_rt.membership.progress import outer_kinds_by_stage

DETAIL_ROWS = 200
"""Workers listed for one stage at most; the rest are counted."""


def _finite(values: Iterable[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def stage_summaries(members: Sequence[Any], restarts: Mapping[str, int]) -> list[dict[str, Any]]:
    """One row per stage: workers by state, inner steps (min, max), mean loss, tokens/s summed,
    restarts and failed checkpoint writes summed, outer steps by kind summed."""
    by_stage: dict[int, list[Any]] = {}
    for member in members:
        by_stage.setdefault(int(member.stage), []).append(member)
    kinds_by_stage = outer_kinds_by_stage(members)  # the same sums `status` and `up` show
    rows = []
    for stage, group in sorted(by_stage.items()):
        states = Counter(member.state.value for member in group)
        losses = _finite(member.loss for member in group)
        steps = [int(member.inner_step) for member in group]
        rows.append({
            "stage": stage, "workers": len(group), "states": dict(sorted(states.items())),
            "step_min": min(steps), "step_max": max(steps),
            "loss": sum(losses) / len(losses) if losses else None,
            "tokens_per_s": round(sum(_finite(member.tokens_per_s for member in group)), 1),
            "restarts": sum(restarts.get(member.name, 0) for member in group),
            "checkpoint_failed": sum(int(member.checkpoint_failed) for member in group),
            "outer_steps": kinds_by_stage[stage],
        })
    return rows


def stage_workers(members: Sequence[Any], stage: int, restarts: Mapping[str, int], *,
                  now: float, limit: int = DETAIL_ROWS) -> dict[str, Any]:
    """The workers of one stage, at most `limit` of them, and how many more there are: those
    that need a look first (not online, failed checkpoint writes, restarts), then by name
    with its numbers in order (s0-r2 before s0-r10)."""
    def order(m: Any) -> tuple[Any, ...]:
        troubled = m.state.value != "ONLINE" or int(m.checkpoint_failed) > 0 or restarts.get(m.name, 0) > 0
        return not troubled, _natural(m.name or m.worker_id), m.worker_id

    group = sorted((m for m in members if int(m.stage) == stage), key=order)
    rows = [{"name": m.name or m.worker_id, "worker": m.worker_id, "state": m.state.value,
             "step": int(m.inner_step), "outer_step": int(m.outer_step), "loss": m.loss,
             "tokens_per_s": round(float(m.tokens_per_s), 1), "restarts": restarts.get(m.name, 0),
             "checkpoint_failed": int(m.checkpoint_failed),
             "heartbeat_age_s": round(max(0.0, now - float(m.heartbeat_time)), 1)} for m in group[:limit]]
    return {"stage": stage, "workers": rows, "more": max(0, len(group) - limit)}


def changes(before: Mapping[str, Any], after: Mapping[str, Any],
            known: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """(kind, worker name, text) of what happened between two readings of the members, keyed by worker
    id: a worker joined, left (said LEAVING), vanished (its record expired without a word),
    came back as a new incarnation of a name seen before (`known`: name -> its last worker
    id; a restart), or failed checkpoint writes."""
    events: list[tuple[str, str, str]] = []
    for worker_id, member in after.items():
        if worker_id in before:
            failed = int(member.checkpoint_failed) - int(before[worker_id].checkpoint_failed)
            if failed > 0:
                events.append(("checkpoint_failed", member.name, f"{_label(member)}: {failed} checkpoint write(s) failed "
                                                    f"({member.checkpoint_failed} in all)"))
            continue
        earlier = known.get(member.name) if member.name else None
        if earlier is not None and earlier != worker_id:
            events.append(("restarted", member.name, f"{_label(member)} restarted (was {earlier})"))
        else:
            events.append(("joined", member.name, f"{_label(member)} joined stage {member.stage}"))
    names_after = {m.name for m in after.values() if m.name}
    for worker_id, member in before.items():
        if worker_id in after or (member.name and member.name in names_after):
            continue
        if member.state.value == "LEAVING":
            events.append(("left", member.name, f"{_label(member)} left"))
        else:
            events.append(("vanished", member.name, f"{_label(member)} vanished (its record expired: killed or cut off)"))
    return events


def _natural(name: str) -> tuple[tuple[int, int | str], ...]:
    """A name's sort key with its digit runs as numbers."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name) if part)


def _label(member: Any) -> str:
    return f"{member.name} ({member.worker_id})" if member.name else member.worker_id
