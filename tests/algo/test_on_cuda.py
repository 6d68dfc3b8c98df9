"""What only a GPU can show of the inner step: a replica's microbatch and inner step make the
host wait for nothing (CUDA's sync debug mode, which also sees synchronisations the CPU's read
counter cannot). Skipped, saying so, without a CUDA device. The replica checks passed on an
H200 on 2026-11-30; the non-finite skip is checked here as it was not there (its gradient is
now made before the window). The fused AdamW on CUDA: tests/algo/test_fused_adamw.py."""

from __future__ import annotations

import warnings

import pytest
import torch

from noloco_rt.algo.replica import StageReplica
from noloco_rt.config import load_config
from noloco_rt.config.presets import PRESETS
from noloco_rt.model.llama import lm_loss

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on a GPU machine)")

SYNC_WARNING = "called a synchronizing CUDA operation"
"""What the sync debug mode warns for each synchronising call (not its own "prototype" notice)."""


def _synchronisations(work) -> list[str]:
    """The synchronising calls CUDA's sync debug mode reports while `work` runs."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            work()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return [str(w.message)[:200] for w in caught if SYNC_WARNING in str(w.message)]


@pytest.mark.parametrize(("stages", "stage"), [(1, 0), (2, 0), (2, 1)])
def test_a_replicas_microbatch_and_inner_step_on_cuda_do_not_synchronise(stages, stage):
    cuda = torch.device("cuda")
    cfg = load_config(environ={}, overrides=[{"model": {"preset": "tiny"}, "pipeline": {"stages": stages}}])
    replica = StageReplica.create(cfg, stage, device=cuda)
    tokens = torch.randint(0, cfg.model.vocab_size, (4, 64), device=cuda)
    hidden = torch.randn(4, 64, PRESETS["tiny"].dim, device=cuda)

    def microbatch_and_step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = replica.module(tokens if stage == 0 else hidden)
        loss = lm_loss(out, tokens) if stage == stages - 1 else out.float().mean()
        loss.backward()
        replica.inner.step()

    microbatch_and_step()  # the optimizer's state is made on its first step
    found = _synchronisations(microbatch_and_step)
    assert found == [], found


def test_an_inner_step_that_skips_a_non_finite_gradient_on_cuda_does_not_synchronise():
    """The skip is decided on the device (found_inf), not read back: a finite, an infinite and a
    finite gradient in a row, made before the watched window (making one can synchronise)."""
    from noloco_rt.algo.optim import InnerOptimizer
    from noloco_rt.config import OptimConfig

    cuda = torch.device("cuda")
    param = torch.nn.Parameter(torch.ones(1000, device=cuda))
    inner = InnerOptimizer([param], OptimConfig(grad_clip=1.0), total_steps=10)
    finite = torch.ones(1000, device=cuda)
    infinite = finite.clone()
    infinite[3] = float("inf")
    param.grad = finite.clone()
    inner.step()  # the optimizer's state is made on its first step
    grads = [finite.clone(), infinite, finite.clone()]

    def three_steps() -> None:
        for grad in grads:
            param.grad = grad
            inner.step()

    found = _synchronisations(three_steps)
    assert found == [], found
    assert inner.skipped_nonfinite == 1 and inner.steps_taken == 4
