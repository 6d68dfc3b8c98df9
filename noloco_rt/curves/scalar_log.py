"""Scalar curves for TensorBoard (and, if asked, W&B offline): the tag names and the writers.

The training loops hand plain {name: value} mappings to `ScalarLog.scalars`; this module
owns every tag name and all the I/O, so a loop never imports tensorboard or wandb. Both
packages are optional: `open_scalar_log` raises ScalarLogUnavailable (a one-line reason)
when one that was asked for is not installed, and the command decides whether that ends
the run (asked for explicitly) or only warns (a default).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from noloco_rt.cli import OneLineError

TAGS = {
    "train_loss": "train/loss",
    "lr": "train/lr",
    "tokens_per_s": "train/tokens_per_s",
    "exchange_wire_bytes": "exchange/wire_bytes",
    "exchange_raw_bytes": "exchange/raw_bytes",
    "val_loss": "val/loss",
    "val_ppl": "val/ppl",
    "spread": "replica_spread",
    "consensus_val_loss": "consensus/val_loss",
    "consensus_val_ppl": "consensus/val_ppl",
}
"""Every scalar name a loop may log, and its tag; `scalars(..., suffix=s)` appends "/s" (a
stage, "all"), one chart per suffix; `run=w` (a worker's name) writes to its own event-file
folder, so the replicas of a stage are curves of one chart, one per worker."""

FLUSH_SECS = 5
"""Event files are flushed this often: a live TensorBoard lags the run by seconds, not minutes."""


class ScalarLogUnavailable(RuntimeError):
    """A requested backend (tensorboard, wandb) is not installed."""


def tag(name: str, suffix: str = "") -> str:
    """The tag of `name` (a key of TAGS; anything else is a bug: KeyError)."""
    return f"{TAGS[name]}/{suffix}" if suffix else TAGS[name]


def _summary_writer_class() -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # torch imports tensorboard itself: this fails without the package
        raise ScalarLogUnavailable("--tensorboard needs the tensorboard package: pip install tensorboard") from None
    return SummaryWriter


def _wandb_module() -> Any:
    try:
        import wandb
    except ImportError:
        raise ScalarLogUnavailable("--wandb needs the wandb package: pip install wandb") from None
    return wandb


class _TensorBoard:
    """One event file in `logdir`, or with `file_per_suffix` one more in `logdir/<suffix>` per
    suffix. Several workers' curves must not share a file: their steps interleave, and a
    reader (TensorBoard's EventAccumulator) takes a step that goes back as a restart and
    drops that tag's points from there on."""

    def __init__(self, writer_class: Any, logdir: Path, *, file_per_suffix: bool = False) -> None:
        self.writer_class = writer_class
        self.logdir = logdir
        self.file_per_suffix = file_per_suffix
        self.writers: dict[str, Any] = {}

    def _writer(self, suffix: str) -> Any:
        key = suffix if self.file_per_suffix else ""
        if key not in self.writers:
            self.writers[key] = self.writer_class(log_dir=str(self.logdir / key if key else self.logdir),
                                                  flush_secs=FLUSH_SECS)
        return self.writers[key]

    def add(self, values: Mapping[str, float], step: int, suffix: str = "") -> None:
        writer = self._writer(suffix)
        for name, value in values.items():
            writer.add_scalar(name, value, global_step=step)

    def flush(self) -> None:
        for writer in self.writers.values():
            writer.flush()

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()


class _Wandb:
    """W&B in offline mode only: nothing leaves the machine (`wandb sync DIR` uploads later)."""

    def __init__(self, wandb: Any, directory: Path, run_name: str) -> None:
        os.environ["WANDB_MODE"] = "offline"
        directory.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(mode="offline", dir=str(directory), project="noloco-rt", name=run_name)
        # Curves of different workers arrive out of step order: plot them against their own step.
        self.run.define_metric("*", step_metric="inner_step")

    def add(self, values: Mapping[str, float], step: int, suffix: str = "") -> None:
        # one W&B run holds every curve: a worker's name keeps the replicas of a stage apart
        named = {f"{name}/{suffix}" if suffix and not name.endswith(f"/{suffix}") else name: value
                 for name, value in values.items()}
        self.run.log({**named, "inner_step": step})

    def flush(self) -> None:
        pass  # offline runs write as they go

    def close(self) -> None:
        self.run.finish()


class ScalarLog:
    """Writes scalars to each opened backend; non-finite and missing values are left out."""

    def __init__(self, backends: list[Any]) -> None:
        self.backends = backends

    def scalars(self, step: int, values: Mapping[str, float | None], *, suffix: str = "", run: str = "") -> None:
        tagged = {tag(name, suffix): float(value) for name, value in values.items()
                  if value is not None and math.isfinite(value)}
        if tagged:
            for backend in self.backends:
                backend.add(tagged, int(step), run or suffix)

    def flush(self) -> None:
        for backend in self.backends:
            backend.flush()

    def close(self) -> None:
        for backend in self.backends:
            backend.close()


def open_scalar_log(tensorboard_dir: Path | None, *, wandb_dir: Path | None = None,
                    run_name: str = "noloco-rt", file_per_suffix: bool = False) -> ScalarLog | None:
    """A log writing to the backends asked for (None when none is); ScalarLogUnavailable if
    one of them is not installed (nothing is created then: both imports come first).
    `file_per_suffix`: each suffix's TensorBoard scalars in their own `tensorboard_dir/<suffix>`
    (needed when the suffixes are processes whose steps interleave)."""
    writer_class = _summary_writer_class() if tensorboard_dir is not None else None
    wandb = _wandb_module() if wandb_dir is not None else None
    backends: list[Any] = []
    if tensorboard_dir is not None:
        backends.append(_TensorBoard(writer_class, tensorboard_dir, file_per_suffix=file_per_suffix))
    if wandb_dir is not None:
        backends.append(_Wandb(wandb, wandb_dir, run_name))
    return ScalarLog(backends) if backends else None


def check_available(*, tensorboard: bool = False, wandb: bool = False) -> None:
    """Raise ScalarLogUnavailable now if a backend asked for is missing (before child processes start)."""
    if tensorboard:
        _summary_writer_class()
    if wandb:
        _wandb_module()


def usage_error(exc: ScalarLogUnavailable) -> Any:
    """The click error for a backend asked for but not installed: one line, exit 2."""
    return OneLineError(str(exc))
