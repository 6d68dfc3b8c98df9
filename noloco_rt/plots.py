"""Loss and replica-spread curves as PNG (matplotlib, no display needed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: never needs a display
import matplotlib.pyplot as plt  # noqa: E402


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
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


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
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
