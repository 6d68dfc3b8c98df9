"""Loss and replica-spread curves as PNG (matplotlib, no display needed)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: never needs a display
import matplotlib.pyplot as plt  # noqa: E402


def save_figure(fig: Any, path: Path, title: str) -> None:
    """Title, layout, write the PNG (creating its folder) and free the figure."""
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_curves(records: Sequence[Mapping[str, Any]], path: Path, *, title: str = "") -> None:
    """Validation loss (left) and replica spread with the learning rate (right) against step."""
    steps = [r["step"] for r in records]
    fig, (loss_ax, spread_ax) = plt.subplots(1, 2, figsize=(11, 4))
    loss_ax.plot(steps, [r["val_loss"] for r in records], label="validation")
    train = [(r["step"], r["train_loss"]) for r in records if r.get("train_loss") is not None]
    if train:
        loss_ax.plot(*zip(*train, strict=True), label="train", alpha=0.6)
    loss_ax.set_xlabel("inner step")
    loss_ax.set_ylabel("loss (nats)")
    loss_ax.legend()
    spread_ax.plot(steps, [r["spread"] for r in records], color="tab:red", label="replica spread")
    spread_ax.set_xlabel("inner step")
    spread_ax.set_ylabel("spread")
    lr_ax = spread_ax.twinx()
    lr_ax.plot(steps, [r["lr"] for r in records], color="tab:gray", linestyle="--", label="learning rate")
    lr_ax.set_ylabel("learning rate")
    spread_ax.legend(loc="upper left")
    lr_ax.legend(loc="upper right")
    save_figure(fig, path, title)


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


def plot_distributed_run(records: Sequence[Mapping[str, Any]], path: Path, *, title: str = "",
                         lr: Callable[[int], float] | None = None, total_steps: int = 0) -> None:
    """curves.png of `noloco-rt up` from its metrics.jsonl records: training loss per
    loss-computing worker and validation loss (left), replica spread with the learning rate
    lr(step) over 0..total_steps (right; NoLoCo's spread follows it), against step."""
    fig, (loss_ax, spread_ax) = plt.subplots(1, 2, figsize=(11, 4))
    train: dict[str, dict[int, float]] = {}
    for record in records:
        for worker in record.get("workers", []) if record.get("kind") == "workers" else []:
            if worker.get("loss") is not None:
                train.setdefault(worker["name"], {})[worker["inner_step"]] = worker["loss"]
    for name, points in sorted(train.items()):
        steps = sorted(points)
        loss_ax.plot(steps, [points[s] for s in steps], alpha=0.6, label=f"train {name}")
    evals = [r for r in records if r.get("kind") in ("eval", "final") and r.get("val_loss") is not None]
    if evals:
        loss_ax.plot([r["step"] for r in evals], [r["val_loss"] for r in evals], "o-", color="black",
                     label="validation")
    loss_ax.set_xlabel("inner step")
    loss_ax.set_ylabel("loss (nats)")
    if train or evals:
        loss_ax.legend(fontsize="small")
    spreads = [r for r in records if r.get("kind") in ("spread", "final") and r.get("spread") is not None]
    spread_ax.plot([r["step"] for r in spreads], [r["spread"] for r in spreads], "o-", color="tab:red")
    spread_ax.set_xlabel("inner step")
    spread_ax.set_ylabel("replica spread (slow weights)")
    if lr is not None and total_steps > 0:
        steps = list(range(0, total_steps + 1, max(1, total_steps // 200)))
        lr_ax = spread_ax.twinx()
        lr_ax.plot(steps, [lr(s) for s in steps], color="tab:gray", linestyle="--", label="learning rate")
        lr_ax.set_ylabel("learning rate")
        lr_ax.legend(loc="upper right")
    save_figure(fig, path, title)
