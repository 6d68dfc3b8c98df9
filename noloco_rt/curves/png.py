"""Loss and replica-spread curves as PNG (matplotlib, no display needed).

Each plot is built by a function that returns the figure (what tests inspect) and written
by one that saves it. Outer steps are light vertical lines: every H inner steps when the
caller knows H, else where the logged outer-step counts put them.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

MAX_OUTER_MARKS = 100
"""More outer steps than this are thinned to every k-th (the legend says k): a line per
outer step of a long run would grey the whole plot."""
SPREAD_BAND_LABEL = "train loss: min–max over replicas"


def save_figure(fig: Any, path: Path, title: str) -> None:
    """Title, layout, write the PNG (creating its folder) and free the figure."""
    if title:  # wrapped to the figure's width: a one-panel figure clipped a long title
        width_chars = max(30, int(fig.get_figwidth() * 9))
        fig.suptitle(textwrap.fill(title, width_chars))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def outer_steps_every(every: int, last_step: int) -> list[float]:
    """Inner steps at which outer steps fall when one is taken every `every` inner steps (pure)."""
    if every <= 0 or last_step < every:
        return []
    return [float(step) for step in range(every, last_step + 1, every)]


def outer_steps_logged(series: Iterable[Sequence[tuple[int, int]]]) -> list[float]:
    """Where outer steps fell, estimated from logged (inner step, outer steps so far) samples,
    one sequence per replica (pure). The outer steps first counted at a sample are spread
    evenly over the inner steps since the previous sample (exact when the samples fall on
    outer steps); outer step k is the mean of the replicas' estimates of it."""
    estimates: dict[int, list[float]] = {}
    for samples in series:
        previous_step, previous_count = 0, 0
        for step, count in sorted(samples):
            if count > previous_count:
                new = count - previous_count
                for i in range(1, new + 1):
                    k = previous_count + i
                    estimates.setdefault(k, []).append(previous_step + i * (step - previous_step) / new)
            previous_step, previous_count = step, max(count, previous_count)
    return [sum(xs) / len(xs) for _, xs in sorted(estimates.items())]


def mark_outer_steps(axes: Sequence[Any], marks: Sequence[float], label: str) -> None:
    """Light vertical lines at `marks` on every axes, one legend entry each (thinned past
    MAX_OUTER_MARKS: the label says which are drawn)."""
    if not marks:
        return
    every = math.ceil(len(marks) / MAX_OUTER_MARKS)
    shown = list(marks)[every - 1::every]
    if every > 1:
        label = f"{label}, 1 in {every} drawn"
    for ax in axes:
        ax.vlines(shown, 0, 1, transform=ax.get_xaxis_transform(), colors="tab:gray", alpha=0.3,
                  linewidth=0.8, label=label, zorder=0)


def min_max_over(curves: Mapping[str, Mapping[int, float]]) -> tuple[list[int], list[float], list[float]]:
    """(steps, lowest, highest) over the curves at every step where two or more of them have a
    value, each curve linearly interpolated between its own points and absent outside them (pure)."""
    points = [(np.array(sorted(c)), np.array([c[s] for s in sorted(c)])) for c in curves.values() if c]
    grid = sorted({s for c in curves.values() for s in c})
    steps, lows, highs = [], [], []
    for step in grid:
        values = [float(np.interp(step, xs, ys)) for xs, ys in points if xs[0] <= step <= xs[-1]]
        if len(values) >= 2:
            steps.append(step)
            lows.append(min(values))
            highs.append(max(values))
    return steps, lows, highs


def _outer_marks_and_label(outer_every: int, last_step: int,
                           logged: Iterable[Sequence[tuple[int, int]]]) -> tuple[list[float], str]:
    if outer_every > 0:
        return outer_steps_every(outer_every, last_step), f"outer step (every {outer_every} inner steps)"
    return outer_steps_logged(logged), "outer step (placed by the logged counts)"


def curves_figure(records: Sequence[Mapping[str, Any]], *, outer_every: int = 0) -> Any:
    """Validation loss (left) and replica spread with the learning rate (right) against step;
    outer steps marked every `outer_every` inner steps, or (0) as the records' outer_steps
    counts place them."""
    steps = [r["step"] for r in records]
    fig, (loss_ax, spread_ax) = plt.subplots(1, 2, figsize=(11, 4))
    loss_ax.plot(steps, [r["val_loss"] for r in records], label="validation")
    train = [(r["step"], r["train_loss"]) for r in records if r.get("train_loss") is not None]
    if train:
        loss_ax.plot(*zip(*train, strict=True), label="train", alpha=0.6)
    loss_ax.set_xlabel("inner step")
    loss_ax.set_ylabel("loss (nats)")
    spread_ax.plot(steps, [r["spread"] for r in records], color="tab:red", label="replica spread")
    spread_ax.set_xlabel("inner step")
    spread_ax.set_ylabel("spread")
    marks, label = _outer_marks_and_label(
        outer_every, max(steps, default=0),
        [[(r["step"], r["outer_steps"]) for r in records if r.get("outer_steps") is not None]])
    mark_outer_steps([loss_ax, spread_ax], marks, label)
    lr_ax = spread_ax.twinx()
    lr_ax.plot(steps, [r["lr"] for r in records], color="tab:gray", linestyle="--", label="learning rate")
    lr_ax.set_ylabel("learning rate")
    loss_ax.legend()
    spread_ax.legend(loc="upper left")
    lr_ax.legend(loc="upper right")
    return fig


def plot_curves(records: Sequence[Mapping[str, Any]], path: Path, *, title: str = "", outer_every: int = 0) -> None:
    """curves_figure written to `path`."""
    save_figure(curves_figure(records, outer_every=outer_every), path, title)


def plot_methods(runs: Mapping[str, Sequence[Mapping[str, Any]]], path: Path, *, title: str = "") -> None:
    """Validation loss and spread of several methods on shared axes."""
    fig, (loss_ax, spread_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for method, records in runs.items():
        steps = [r["step"] for r in records]
        loss_ax.plot(steps, [r["val_loss"] for r in records], label=method)
        spread_ax.plot(steps, [r["spread"] for r in records], label=method)
    loss_ax.set_xlabel("inner step")
    loss_ax.set_ylabel("validation loss (nats)")
    loss_ax.legend()
    spread_ax.set_xlabel("inner step")
    spread_ax.set_ylabel("replica spread")
    spread_ax.legend()
    save_figure(fig, path, title)


def distributed_run_figure(records: Sequence[Mapping[str, Any]], *, lr: Callable[[int], float] | None = None,
                           total_steps: int = 0, outer_every: int = 0) -> Any:
    """The figure of plot_distributed_run."""
    fig, (loss_ax, spread_ax) = plt.subplots(1, 2, figsize=(11, 4))
    train: dict[str, dict[int, float]] = {}
    outer: dict[str, list[tuple[int, int]]] = {}
    for record in records:
        for worker in record.get("workers", []) if record.get("kind") == "workers" else []:
            if worker.get("loss") is not None:
                train.setdefault(worker["name"], {})[worker["inner_step"]] = worker["loss"]
            if worker.get("outer_step") is not None:
                outer.setdefault(worker["name"], []).append((worker["inner_step"], worker["outer_step"]))
    band_steps, lows, highs = min_max_over(train)
    if band_steps:
        loss_ax.fill_between(band_steps, lows, highs, color="tab:blue", alpha=0.15, linewidth=0,
                             label=SPREAD_BAND_LABEL)
    for name, points in sorted(train.items()):
        steps = sorted(points)
        loss_ax.plot(steps, [points[s] for s in steps], alpha=0.6, label=f"train {name}")
    evals = [r for r in records if r.get("kind") in ("eval", "final") and r.get("val_loss") is not None]
    if evals:
        loss_ax.plot([r["step"] for r in evals], [r["val_loss"] for r in evals], "o-", color="black",
                     label="validation")
    loss_ax.set_xlabel("inner step")
    loss_ax.set_ylabel("loss (nats)")
    spreads = [r for r in records if r.get("kind") in ("spread", "final") and r.get("spread") is not None]
    if spreads:
        spread_ax.plot([r["step"] for r in spreads], [r["spread"] for r in spreads], "o-", color="tab:red",
                       label="replica spread (slow weights)")
    spread_ax.set_xlabel("inner step")
    spread_ax.set_ylabel("replica spread (slow weights)")
    last_step = max([total_steps, *(s for c in train.values() for s in c), *(r["step"] for r in evals + spreads)])
    marks, label = _outer_marks_and_label(outer_every, last_step, outer.values())
    mark_outer_steps([loss_ax, spread_ax], marks, label)
    if train or evals or marks:
        loss_ax.legend(fontsize="small")
    if spreads or marks:
        spread_ax.legend(loc="upper left", fontsize="small")
    if lr is not None and total_steps > 0:
        steps = list(range(0, total_steps + 1, max(1, total_steps // 200)))
        lr_ax = spread_ax.twinx()
        lr_ax.plot(steps, [lr(s) for s in steps], color="tab:gray", linestyle="--", label="learning rate")
        lr_ax.set_ylabel("learning rate")
        lr_ax.legend(loc="upper right", fontsize="small")
    return fig


def plot_distributed_run(records: Sequence[Mapping[str, Any]], path: Path, *, title: str = "",
                         lr: Callable[[int], float] | None = None, total_steps: int = 0, outer_every: int = 0) -> None:
    """curves.png of `noloco-rt up` from its metrics.jsonl records: training loss per
    loss-computing worker with its min–max band over the replicas, and validation loss
    (left); replica spread with the learning rate lr(step) over 0..total_steps (right;
    NoLoCo's spread follows it); against step. Outer steps are marked on both: every
    `outer_every` inner steps, or (0) where the workers' logged outer-step counts put them."""
    save_figure(distributed_run_figure(records, lr=lr, total_steps=total_steps, outer_every=outer_every),
                path, title)
