"""How an `up` run ended: every worker's final figures, outer steps by kind per stage, and a
warning when too few outer steps were matched.

The membership table loses a worker the moment it finishes, so the last sample `up` took
while watching is a few seconds old. Each worker's own last word is its `worker_summary`
log line (one per incarnation, written as it exits): the final sample is built from those.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from noloco_rt.logs import read_json_lines
from noloco_rt.membership.progress import (
    OUTER_STEP_KINDS,
    outer_kind_fields,
    outer_kinds_by_stage,
    outer_kinds_text,
)
from workers.cluster.run_view import WorkerRow

MATCHED_SHARE_FLOOR = 0.9
"""Below this share of matched outer steps in a stage of several replicas, `up` warns."""

Summary = dict[str, Any]


def incarnation_logs(logs_dir: Path, name: str) -> list[Path]:
    """The logs of every incarnation of worker `name` (`<name>.<n>.log`), oldest first."""
    def incarnation(path: Path) -> int:
        number = path.name[len(name) + 1:-len(".log")]
        return int(number) if number.isdigit() else -1
    return sorted((p for p in logs_dir.glob(f"{name}.*.log") if incarnation(p) >= 0), key=incarnation)


def worker_summaries(log_paths: Iterable[Path]) -> list[Summary]:
    """The `worker_summary` events of these logs, in the order given (incarnation order)."""
    found: list[Summary] = []
    for path in log_paths:
        events, _ = read_json_lines(path)
        found += [e for e in events if e.get("event") == "worker_summary"]
    return found


def final_row(row: WorkerRow, summaries: Sequence[Summary]) -> WorkerRow:
    """`row` with the figures its incarnations reported as they exited: counts summed over
    incarnations, steps from the last one. Unchanged when none reported (killed at once).
    Its inner step is the worker's clock, as its heartbeat publishes it: the inner steps it
    trained plus those a pull skipped (workers/counters.py)."""
    if not summaries:
        return row
    last = summaries[-1]
    kinds: collections.Counter[str] = collections.Counter()
    for summary in summaries:
        kinds.update({k: int(v) for k, v in (summary.get("outer_kinds") or {}).items() if k in OUTER_STEP_KINDS})
    return dataclasses.replace(row, inner_step=int(last.get("inner_steps", row.inner_step)) + int(last.get("skipped_steps", 0)),
                               outer_step=int(last.get("outer_steps", row.outer_step)),
                               retried=sum(int(s.get("retried", 0)) for s in summaries),
                               dropped=sum(int(s.get("dropped", 0)) for s in summaries),
                               checkpoint_failed=sum(checkpoint_failures(s) for s in summaries),
                               queue_depth=0, tokens_per_s=0.0, **outer_kind_fields(kinds))


def checkpoint_failures(summary: Summary) -> int:
    """Failed writes of the worker's own checkpoint in one summary, all kinds together."""
    failed = (summary.get("checkpoint") or {}).get("failed") or {}
    return sum(int(count) for count in failed.values())


def unmatched_reasons(summaries: Iterable[Summary]) -> collections.Counter[str]:
    """Why outer steps were not matched, summed over summaries."""
    reasons: collections.Counter[str] = collections.Counter()
    for summary in summaries:
        reasons.update({str(k): int(v) for k, v in (summary.get("unmatched_reasons") or {}).items()})
    return reasons


def outer_outcome(rows: Sequence[WorkerRow], summaries: Mapping[str, Sequence[Summary]],
                  names_by_stage: Mapping[str, int]) -> tuple[str, str | None]:
    """Outer steps by kind per stage as one line, and the warning when too few matched."""
    by_stage = outer_kinds_by_stage(rows)
    reasons = {stage: unmatched_reasons(s for name, of_stage in names_by_stage.items() if of_stage == stage
                                        for s in summaries.get(name, ())) for stage in by_stage}
    return outer_kinds_text(by_stage), matched_warning(by_stage, reasons, collections.Counter(names_by_stage.values()))


def matched_warning(by_stage: Mapping[int, Mapping[str, int]], reasons_by_stage: Mapping[int, Mapping[str, int]],
                    replicas_by_stage: Mapping[int, int]) -> str | None:
    """One line when a stage of several replicas matched under MATCHED_SHARE_FLOOR of its
    outer steps, naming the most frequent reason; None otherwise. A stage of one replica
    has nobody to match with: its steps are local by design."""
    shortfalls = []
    for stage, counts in sorted(by_stage.items()):
        total = sum(counts.values())
        if replicas_by_stage.get(stage, 0) < 2 or total == 0:
            continue
        share = counts.get("matched", 0) / total
        if share >= MATCHED_SHARE_FLOOR:
            continue
        reasons = reasons_by_stage.get(stage) or {}
        why = max(reasons.items(), key=lambda item: item[1]) if reasons else None
        shortfalls.append(f"stage {stage} matched {counts.get('matched', 0)} of {total} outer steps "
                          f"({share:.0%}, under {MATCHED_SHARE_FLOOR:.0%})"
                          + (f", most often {why[0]} ({why[1]})" if why else ""))
    return "; ".join(shortfalls) if shortfalls else None
