"""FAULT INJECTION for tests and chaos runs only (worker.fault_scale_snapshot,
worker.fault_nan_snapshot; off by default): what a broken or hostile peer would serve."""

from __future__ import annotations

import math

import torch

from noloco_rt.config import Config


def snapshot_faults_on(cfg: Config) -> bool:
    return cfg.worker.fault_scale_snapshot != 1.0 or cfg.worker.fault_nan_snapshot


def inject_snapshot_faults(parts: list[torch.Tensor], cfg: Config) -> list[torch.Tensor]:
    """`parts` scaled and/or with a NaN as configured; copies, never the worker's own weights."""
    scale, nan = cfg.worker.fault_scale_snapshot, cfg.worker.fault_nan_snapshot
    if not snapshot_faults_on(cfg):
        return parts
    faulty = [t.detach().float() * scale for t in parts]
    if nan and faulty and faulty[0].numel():
        faulty[0].view(-1)[0] = math.nan
    return faulty
