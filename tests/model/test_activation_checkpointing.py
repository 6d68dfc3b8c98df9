"""Activation checkpointing per block (model.activation_checkpointing): the same gradients
as the plain forward, less memory held by a microbatch in flight."""

from __future__ import annotations

import pytest
import torch

from noloco_rt.algo.replica import StageReplica
from noloco_rt.config import ConfigError, load_config
from noloco_rt.memory.tracker import TensorMemoryTracker
from noloco_rt.model.llama import build_stage, lm_loss


def gradients(checkpointing: bool, stage: int, precision: torch.dtype | None) -> tuple[list[torch.Tensor], float]:
    """Parameter gradients (and the input's, on a later stage) of one microbatch."""
    module = build_stage("small", vocab_size=256, stage=stage, num_stages=2, seed=3)
    module.activation_checkpointing = checkpointing
    generator = torch.Generator().manual_seed(7)
    targets = torch.randint(0, 256, (2, 32), generator=generator)
    if stage == 0:
        inputs = torch.randint(0, 256, (2, 32), generator=generator)
    else:
        inputs = torch.randn(2, 32, 256, generator=generator).requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision is not None):
        out = module(inputs)
    if stage == 0:
        out.backward(torch.randn(out.shape, generator=generator))
        loss = float("nan")
    else:
        loss_tensor = lm_loss(out.float(), targets)
        loss_tensor.backward()
        loss = loss_tensor.item()
    grads = [p.grad for p in module.parameters()] + ([inputs.grad] if inputs.is_floating_point() else [])
    return grads, loss


@pytest.mark.parametrize("stage", [0, 1])
@pytest.mark.parametrize("precision", [None, torch.bfloat16])
def test_checkpointing_gives_the_same_gradients(stage: int, precision: torch.dtype | None) -> None:
    plain, plain_loss = gradients(False, stage, precision)
    checkpointed, checkpointed_loss = gradients(True, stage, precision)
    assert all(g is not None for g in plain)
    for a, b in zip(plain, checkpointed, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # the same ops on the same inputs, replayed
    assert plain_loss == checkpointed_loss or stage == 0


def test_checkpointing_holds_less_for_a_microbatch_in_flight() -> None:
    held = {}
    for checkpointing in (False, True):
        with TensorMemoryTracker() as tracker:
            module = build_stage("small", vocab_size=256, stage=0, num_stages=2, seed=0)
            module.activation_checkpointing = checkpointing
            before = tracker.live_bytes
            out = module(torch.randint(0, 256, (4, 64)))
            held[checkpointing] = tracker.live_bytes - before
            out.sum().backward()
    assert held[True] * 10 < held[False]  # three blocks' inputs instead of all they save


def test_no_grad_forwards_skip_the_checkpoint() -> None:
    module = build_stage("tiny", vocab_size=256, stage=0, num_stages=1, seed=0)
    tokens = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        plain = module(tokens)
        module.activation_checkpointing = True
        checkpointed = module(tokens)
    torch.testing.assert_close(plain, checkpointed, rtol=0, atol=0)


def test_the_replica_follows_the_config_and_auto_is_off_without_a_device_plan() -> None:
    for setting, expected in (("on", True), ("off", False), ("auto", False)):
        cfg = load_config(environ={}, overrides=[{"model": {"activation_checkpointing": setting}}])
        assert StageReplica.create(cfg, 0).module.activation_checkpointing is expected


def test_a_bad_setting_names_the_field() -> None:
    with pytest.raises(ConfigError, match="model.activation_checkpointing"):
        load_config(environ={}, overrides=[{"model": {"activation_checkpointing": "yes"}}])
