"""Mixed precision in workers (model.precision): the stage's forward autocasts its matmuls to
bfloat16 when asked (on CUDA by default), while weights, their gradients and the loss stay float32.
CI has no GPU, so the bfloat16 path runs here on the CPU, where autocast works the same way."""

from __future__ import annotations

import threading

import pytest
import torch

from noloco_rt.algo.replica import StageReplica
from noloco_rt.config import ConfigError, load_config
from noloco_rt.model.llama import lm_loss
from noloco_rt.model.staged import preset_model
from workers.counters import Counters
from workers.data_path.context import DataContext
from workers.device import HostStaging, autocast_dtype
from workers.metrics import WorkerMetrics


def _context(precision: str, stage: int) -> DataContext:
    cfg = load_config(environ={}, overrides=[{"pipeline": {"stages": 2}, "model": {"precision": precision}}])
    return DataContext(cfg=cfg, stage=stage, worker_id="me", model=preset_model(cfg), replica=StageReplica.create(cfg, stage),
                       staging=HostStaging(torch.device("cpu")), data=None, peers=None, counters=Counters(),
                       metrics=WorkerMetrics(), log=None, leave_requested=threading.Event())


def test_auto_is_bfloat16_on_cuda_and_float32_on_cpu():
    assert autocast_dtype("auto", torch.device("cuda", 0)) is torch.bfloat16
    assert autocast_dtype("auto", torch.device("cpu")) is None
    assert autocast_dtype("float32", torch.device("cuda", 0)) is None
    assert autocast_dtype("bfloat16", torch.device("cpu")) is torch.bfloat16


def test_bfloat16_forward_keeps_float32_weights_gradients_and_loss():
    first, last = _context("bfloat16", 0), _context("bfloat16", 1)
    tokens = torch.randint(0, 256, (2, 16))
    hidden = first.run_stage(tokens)
    plain = first.replica.module(tokens)
    # The matmuls ran in bfloat16 (the residual stream itself stays float32): close, not equal.
    assert not torch.equal(hidden, plain) and torch.allclose(hidden, plain, atol=0.05, rtol=0.05)
    hidden_in = hidden.detach().float().requires_grad_(True)  # what the next stage receives
    logits = last.run_stage(hidden_in)
    loss = lm_loss(logits.float(), torch.randint(0, 256, (2, 16)))
    assert loss.dtype is torch.float32 and torch.isfinite(loss)
    loss.backward()
    assert hidden_in.grad is not None and hidden_in.grad.dtype is torch.float32
    hidden.backward(hidden_in.grad.to(hidden.dtype))  # the returned gradient, as roles.py applies it
    for module in (first.replica.module, last.replica.module):
        params = list(module.parameters())
        assert all(p.dtype is torch.float32 for p in params)
        assert all(p.grad is not None and p.grad.dtype is torch.float32 for p in params)


def test_float32_precision_is_the_plain_forward():
    ctx = _context("float32", 0)
    tokens = torch.randint(0, 256, (2, 16))
    assert torch.equal(ctx.run_stage(tokens), ctx.replica.module(tokens))


def test_an_unknown_precision_is_refused():
    with pytest.raises(ConfigError, match="auto, float32, bfloat16"):
        load_config(environ={}, overrides=[{"model": {"precision": "fp8"}}])
