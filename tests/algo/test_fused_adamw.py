"""The inner optimizer's AdamW without torch.optim (noloco_rt/algo/fused_adamw.py): bit for bit
torch.optim.AdamW(fused=True), checkpoints interchangeable with it, and a replica that trains
and checkpoints without torch._dynamo ever being imported."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch

from noloco_rt.algo.fused_adamw import FusedAdamW

BETAS = (0.9, 0.95)
SHAPES = [((5, 3), torch.float32), ((7,), torch.float32), ((4, 2), torch.bfloat16)]


def _params(seed: int = 0, device: str = "cpu") -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=generator).to(dtype).to(device)) for shape, dtype in SHAPES]


def _grads(step: int, device: str = "cpu") -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(100 + step)
    return [torch.randn(shape, generator=generator).to(dtype).to(device) for shape, dtype in SHAPES]


def _step_both(ours: FusedAdamW, theirs: torch.optim.AdamW, step: int, *, found_inf: float = 0.0,
               skip_param: int | None = None) -> None:
    """One step of each on the same gradients, learning rate, scale and skip flag."""
    lr = 0.01 / (1 + step)
    device = ours.params[0].device  # the kernel takes its scale and flag on the parameters' device
    scale, flag = torch.tensor(4.0, device=device), torch.tensor(found_inf, device=device)
    for optimizer in (ours, theirs):
        params = optimizer.params if isinstance(optimizer, FusedAdamW) else optimizer.param_groups[0]["params"]
        for index, (param, grad) in enumerate(zip(params, _grads(step, device), strict=True)):
            param.grad = None if index == skip_param else grad.clone()
        optimizer.grad_scale, optimizer.found_inf = scale, flag
    ours.lr = lr
    theirs.param_groups[0]["lr"] = lr
    ours.step()
    theirs.step()


def _assert_same(ours: FusedAdamW, theirs: torch.optim.AdamW) -> None:
    for mine, reference in zip(ours.params, theirs.param_groups[0]["params"], strict=True):
        assert torch.equal(mine.detach(), reference.detach())
        assert set(ours.state[mine]) == set(theirs.state[reference])
        for key, value in ours.state[mine].items():
            assert value.dtype == theirs.state[reference][key].dtype, key
            assert torch.equal(value, theirs.state[reference][key]), key


def _pair(seed: int = 0, device: str = "cpu") -> tuple[FusedAdamW, torch.optim.AdamW]:
    ours = FusedAdamW(_params(seed, device), lr=0.01, betas=BETAS, weight_decay=0.1)
    theirs = torch.optim.AdamW(_params(seed, device), lr=0.01, betas=BETAS, weight_decay=0.1, fused=True)
    return ours, theirs


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device (run on a GPU machine)"))])
def test_steps_are_bit_for_bit_torch_optims_fused_adamw_with_a_scale_a_skip_and_a_missing_gradient(device):
    ours, theirs = _pair(device=device)
    _step_both(ours, theirs, 0)
    _step_both(ours, theirs, 1, found_inf=1.0)  # skipped by the kernel: weights, moments and counts stay
    _step_both(ours, theirs, 2, skip_param=1)  # a parameter without a gradient is left alone
    _step_both(ours, theirs, 3)
    _assert_same(ours, theirs)
    assert [float(ours.state[p]["step"]) for p in ours.params] == [3.0, 2.0, 3.0]
    assert not torch.equal(ours.params[0].detach(), _params(device=device)[0])  # it did step


@pytest.mark.parametrize("direction", ["torch-to-ours", "ours-to-torch"])
def test_a_state_dict_of_either_loads_into_the_other_and_training_goes_on_the_same(direction):
    ours, theirs = _pair()
    for step in range(2):
        _step_both(ours, theirs, step)
    fresh_ours, fresh_theirs = _pair(seed=1)  # other weights: only the optimizer state is carried
    with torch.no_grad():
        for target, source in zip(fresh_ours.params + fresh_theirs.param_groups[0]["params"],
                                  ours.params + theirs.param_groups[0]["params"], strict=True):
            target.copy_(source)
    # A state_dict holds the live tensors, as torch.optim's does (a checkpoint copies them): deep
    # copies, or the loaded optimizers would share moments with the ones they came from.
    saved = theirs.state_dict() if direction == "torch-to-ours" else ours.state_dict()
    fresh_ours.load_state_dict(copy.deepcopy(saved))
    fresh_theirs.load_state_dict(copy.deepcopy(saved))
    for step in range(2, 4):
        _step_both(fresh_ours, fresh_theirs, step)
        _step_both(ours, theirs, step)
    _assert_same(fresh_ours, fresh_theirs)
    _assert_same(fresh_ours, theirs)


def test_a_state_dict_of_other_parameters_is_refused_with_what_differs():
    ours, theirs = _pair()
    _step_both(ours, theirs, 0)
    fewer = FusedAdamW(_params()[:2], lr=0.01, betas=BETAS, weight_decay=0.1)
    with pytest.raises(ValueError, match="holds 3 parameters, this stage has 2"):
        fewer.load_state_dict(ours.state_dict())
    reshaped = FusedAdamW([torch.nn.Parameter(torch.zeros(3, 5)), *_params()[1:]], lr=0.01, betas=BETAS,
                          weight_decay=0.1)
    with pytest.raises(ValueError, match=r"exp_avg of parameter 0 has shape \(5, 3\), the parameter \(3, 5\)"):
        reshaped.load_state_dict(ours.state_dict())


CHILD_TRAINING_A_REPLICA = """
import sys
import torch
from noloco_rt.algo.replica import StageReplica
from noloco_rt.config import load_config

cfg = load_config(environ={}, overrides=[{"model": {"preset": "tiny"}, "pipeline": {"stages": 1}}])
replica = StageReplica.create(cfg, 0)
tokens = torch.randint(0, cfg.model.vocab_size, (2, 16))
for _ in range(2):
    logits = replica.module(tokens)
    logits.float().mean().backward()
    replica.inner.step()
replica.inner.load_state_dict(replica.inner.state_dict())
print(replica.inner.steps_taken, "torch._dynamo" in sys.modules)
"""


def test_a_replica_trains_and_checkpoints_its_optimizer_without_importing_torch_dynamo():
    """What a worker that compiles nothing runs: importing torch._dynamo would cost it seconds
    of a core and tens of megabytes (torch.optim imports it on its first parameter group)."""
    child = subprocess.run([sys.executable, "-c", CHILD_TRAINING_A_REPLICA], capture_output=True, text=True,
                           timeout=120)
    assert child.returncode == 0, child.stderr[-3000:]
    assert child.stdout.split() == ["2", "False"]
