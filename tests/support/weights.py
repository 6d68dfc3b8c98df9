"""Test helper: a consensus file of random weights (norms included, so that every tensor's
mapping is exercised), without training anything."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from noloco_rt.config import Config, load_config
from noloco_rt.consensus.file import save_consensus, stage_parameter_shapes
from noloco_rt.model.llama import build_model


def random_consensus(path: Path, *, preset: str = "tiny", stages: int = 2, seed: int = 0,
                     **overrides: dict) -> tuple[Config, dict[str, torch.Tensor]]:
    """Write a consensus of `preset` to `path`; returns its config and its tensors by name."""
    cfg = load_config(environ={}, overrides=[{"model": {"preset": preset}, "pipeline": {"stages": stages},
                                              "run": {"seed": seed, "eval_batches": 2}, **overrides}])
    model = build_model(preset, vocab_size=cfg.model.vocab_size, seed=seed)
    generator = torch.Generator().manual_seed(seed + 1)
    state = {name: (p.detach() + 0.05 * torch.randn(p.shape, generator=generator)).contiguous()
             for name, p in model.named_parameters()}
    save_consensus(path, cfg, [[state[name] for name, _ in stage_parameter_shapes(cfg, s)] for s in range(stages)])
    return cfg, state


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Imported by a test module: one torch thread for its tests (on 2 busy cores, spinning
    OpenMP threads only slow a tiny model down)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def random_stages(cfg, seed: int) -> list[list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [[torch.randn(shape, generator=generator) for _, shape in stage_parameter_shapes(cfg, s)]
            for s in range(cfg.pipeline.stages)]


def worker_state(cfg, stage: int, slow: list[torch.Tensor], run_id: str | None = None) -> dict:
    # What workers/worker.py writes: slow and fast weights, momentum, optimizer state, counters, cursor.
    return {"run_id": run_id or cfg.run.run_id, "stage": stage, "name": f"w{stage}", "slow": slow,
            "fast": [t + 1 for t in slow], "momentum": [torch.zeros_like(t) for t in slow],
            "inner_optimizer": {"state": {}}, "counters": {"inner_steps": 10, "outer_steps": 2},
            "cursor": {"epoch": 0, "position": 8}}

