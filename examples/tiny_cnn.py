"""Your own model through noloco-rt's Python API: a small CNN in two pipeline stages.

It learns to tell which way a noisy bar in a 16x16 image points (four classes:
horizontal, vertical and the two diagonals), from images made on the fly, so it needs no
download. Train it on this machine, 2 stages x 2 replicas:

    noloco-rt up --model examples/tiny_cnn.py:staged_model --stages 2 --replicas 2 --steps 200

Every worker and the coordinator call `staged_model(cfg)`; what it returns says how to
build each stage, the loss, and the data (docs/own-model.md).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn
from torch.nn import functional as F

from noloco_rt.config import Config
from noloco_rt.model.staged import StagedModel

SIZE = 16
CLASSES = 4
VALIDATION_SEED = 12345


def bars(count: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` images (count, 1, SIZE, SIZE) of a bar through a random point, and its direction."""
    labels = torch.randint(CLASSES, (count,), generator=generator)
    centre = torch.randint(4, SIZE - 4, (count, 2), generator=generator)
    steps = torch.arange(-3, 4)
    direction = torch.tensor([[0, 1], [1, 0], [1, 1], [1, -1]])[labels]  # (row, column) per step
    rows = (centre[:, :1] + direction[:, :1] * steps).clamp(0, SIZE - 1)
    cols = (centre[:, 1:] + direction[:, 1:] * steps).clamp(0, SIZE - 1)
    images = 0.5 * torch.randn(count, SIZE * SIZE, generator=generator)
    images.scatter_(1, rows * SIZE + cols, 2.0)
    return images.view(count, 1, SIZE, SIZE), labels


def staged_model(cfg: Config) -> StagedModel:
    batch = cfg.data.batch_size

    def build_stage(stage: int) -> nn.Module:
        torch.manual_seed(cfg.run.seed * 100 + stage)  # every replica of a stage starts the same
        if stage == 0:
            return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))  # -> (B, 32, 4, 4)
        return nn.Sequential(nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, CLASSES))

    def train_batches(stream_seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        generator = torch.Generator().manual_seed(stream_seed)
        while True:  # endless: each first-stage worker draws its own stream
            yield bars(batch, generator)

    def val_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
        generator = torch.Generator().manual_seed(VALIDATION_SEED)
        return [bars(batch, generator) for _ in range(cfg.run.eval_batches)]

    return StagedModel(num_stages=2, build_stage=build_stage, loss=F.cross_entropy,
                       train_batches=train_batches, val_batches=val_batches,
                       input_shape=lambda stage: (batch, 32, 4, 4))
