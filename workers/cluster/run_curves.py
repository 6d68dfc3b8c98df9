"""`noloco-rt up --tensorboard`: the workers' curves, read from their JSON logs as they grow.

Each worker already logs what a person wants to plot (train_progress: loss, tokens/s, lr;
outer_step_done: bytes exchanged); `up` follows those files (every incarnation, so a
restarted worker's curve goes on) and hands the figures to one ScalarLog, one curve per
worker, the replicas of a stage on one chart. Files already there when `up` starts belong to an earlier invocation on the same
run directory and are skipped, so a resumed run does not draw its past twice.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from noloco_rt.logs import read_json_lines

if TYPE_CHECKING:
    from noloco_rt.curves.scalar_log import ScalarLog


def scalars_of(event: Mapping[str, Any]) -> tuple[int, dict[str, Any]] | None:
    """(inner step, {scalar name: value}) of one worker log record; None for other events."""
    if "inner_step" not in event:
        return None
    if event.get("event") == "train_progress":
        return int(event["inner_step"]), {"train_loss": event.get("loss"), "tokens_per_s": event.get("tokens_per_s"),
                                          "lr": event.get("lr")}
    if event.get("event") == "outer_step_done" and "wire_bytes" in event:
        return int(event["inner_step"]), {"exchange_wire_bytes": event["wire_bytes"],
                                          "exchange_raw_bytes": event.get("raw_bytes")}
    return None


def stage_heading(name: str) -> str:
    """The chart a worker's curves go to: its stage's ("s1-r0" -> "stage1"), so the replicas
    of a stage overlay; a name of another form keeps its own chart."""
    match = re.fullmatch(r"s(\d+)-r\d+", name)
    return f"stage{match.group(1)}" if match else name


class WorkerLogCurves:
    """Follows `<log_dir>/<name>.<incarnation>.log` of each worker name and writes their scalars."""

    def __init__(self, log_dir: Path, names: Iterable[str], scalar_log: ScalarLog) -> None:
        self.log_dir = log_dir
        self.names = list(names)
        self.scalar_log = scalar_log
        self.offsets = {path: path.stat().st_size for path in self._files()}

    def _files(self) -> list[Path]:
        return [path for name in self.names for path in sorted(self.log_dir.glob(f"{name}.*.log"))]

    def poll(self) -> int:
        """Write what the logs gained since the last poll; returns how many records gave scalars."""
        written = 0
        for path in self._files():
            records, self.offsets[path] = read_json_lines(path, self.offsets.get(path, 0))
            name = path.name.split(".")[0]
            for record in records:
                found = scalars_of(record)
                if found is not None:
                    self.scalar_log.scalars(found[0], found[1], suffix=stage_heading(name), run=name)
                    written += 1
        return written

    def final(self, result: Mapping[str, Any]) -> None:
        """The consensus of the workers' final checkpoints, scored by `up` at the end."""
        step = int(result["step"])
        self.scalar_log.scalars(step, {"consensus_val_loss": result.get("val_loss"),
                                       "consensus_val_ppl": result.get("val_ppl")})
        self.scalar_log.scalars(step, {"spread": result.get("spread")}, suffix="all")

    def close(self) -> None:
        self.poll()  # the lines written while the workers stopped
        self.scalar_log.close()
