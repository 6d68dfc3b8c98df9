"""Diagnostics the paper relies on: replica spread and perplexity."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


@torch.no_grad()
def replica_spread(replicas: Sequence[Sequence[torch.Tensor]]) -> float:
    """sqrt( Σ_replicas Σ_params (p − mean_replicas p)² / (R · P) ).

    `replicas` holds, per replica, the same list of tensors (one stage, or several
    stages' lists concatenated); P counts scalar parameters.
    """
    if not replicas:
        raise ValueError("spread of no replicas")
    count = len(replicas)
    squared = 0.0
    numel = 0
    for tensors in zip(*replicas, strict=True):
        stacked = torch.stack([t.detach().double() for t in tensors])  # (R, *shape)
        squared += float(((stacked - stacked.mean(dim=0)) ** 2).sum())
        numel += tensors[0].numel()
    return math.sqrt(squared / (count * numel)) if numel else 0.0


def pooled_spread(by_stage: Sequence[float], numels: Sequence[int]) -> float:
    """One spread over all parameters from per-stage spreads (each over that stage's
    replicas, whose counts may differ): squared spreads weighted by parameter count."""
    total = sum(numels)
    if not total:
        return 0.0
    return math.sqrt(sum(s * s * n for s, n in zip(by_stage, numels, strict=True)) / total)


def perplexity(loss_nats: float) -> float:
    return math.exp(min(loss_nats, 50.0))
