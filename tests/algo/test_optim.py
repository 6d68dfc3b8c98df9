"""The outer step against an independent, element-wise re-derivation of docs/architecture.md §1."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from noloco_rt.algo.fused_adamw import FusedAdamW
from noloco_rt.algo.optim import InnerOptimizer, adamw_kernel, lr_at
from noloco_rt.config import OptimConfig, OuterConfig
from noloco_rt.outer.formula import (
    OuterCoefficients,
    PeerOuterState,
    group_outer_step,
    mean_of,
    outer_step,
    outer_step_from_fast,
)
from noloco_rt.outer.matching import draw_groups

SHAPES = [(3,), (2, 4), (5, 1, 2)]


def reference_outer(phi, delta, theta, group_theta, group_phi, alpha, beta, gamma):
    """Straight from the paper's formula, in float64 numpy, one tensor at a time.
    group_* include member i itself."""
    new_phi, new_delta = [], []
    for k in range(len(phi)):
        grads = [group_theta[j][k] - group_phi[j][k] for j in range(len(group_theta))]
        mean_grad = sum(grads) / len(grads)
        mean_phi = sum(group_phi[j][k] for j in range(len(group_phi))) / len(group_phi)
        d = alpha * delta[k] + beta * mean_grad + gamma * (mean_phi - phi[k])
        new_delta.append(d)
        new_phi.append(phi[k] + d)
    return new_phi, new_delta


def random_state(rng: np.random.Generator):
    return [rng.standard_normal(shape) for shape in SHAPES]


def as_torch(arrays):
    return [torch.tensor(a, dtype=torch.float64) for a in arrays]


coefficient = st.floats(min_value=0.0, max_value=1.5, allow_nan=False)


@given(seed=st.integers(0, 2**32 - 1), group_size=st.integers(1, 5), alpha=coefficient, beta=coefficient,
       gamma=coefficient)
def test_general_formula_matches_reference(seed, group_size, alpha, beta, gamma):
    rng = np.random.default_rng(seed)
    members_theta = [random_state(rng) for _ in range(group_size)]
    members_phi = [random_state(rng) for _ in range(group_size)]
    delta0 = random_state(rng)
    want_phi, want_delta = reference_outer(members_phi[0], delta0, members_theta[0], members_theta, members_phi,
                                           alpha, beta, gamma)

    slow, momentum, fast = as_torch(members_phi[0]), as_torch(delta0), as_torch(members_theta[0])
    peers = [PeerOuterState.of(as_torch(members_theta[j]), as_torch(members_phi[j]), theta_only=False)
             for j in range(1, group_size)]
    group_outer_step(slow, momentum, fast, peers, OuterCoefficients(alpha, beta, gamma))

    for got, want in zip(slow, want_phi, strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)
    for got, want in zip(momentum, want_delta, strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)
    for f, s in zip(fast, slow, strict=True):  # θ ← φ
        assert torch.equal(f, s)


@given(seed=st.integers(0, 2**32 - 1), group_size=st.integers(1, 5), alpha=coefficient, beta=coefficient)
def test_theta_only_shortcut_equals_general_formula_when_gamma_is_beta(seed, group_size, alpha, beta):
    rng = np.random.default_rng(seed)
    members_theta = [random_state(rng) for _ in range(group_size)]
    members_phi = [random_state(rng) for _ in range(group_size)]
    delta0 = random_state(rng)
    want_phi, want_delta = reference_outer(members_phi[0], delta0, members_theta[0], members_theta, members_phi,
                                           alpha, beta, beta)

    slow, momentum, fast = as_torch(members_phi[0]), as_torch(delta0), as_torch(members_theta[0])
    # Peers send θ only: their φ never reaches the receiver.
    peers = [PeerOuterState(fast=as_torch(members_theta[j])) for j in range(1, group_size)]
    group_outer_step(slow, momentum, fast, peers, OuterCoefficients(alpha, beta, beta))

    for got, want in zip(slow, want_phi, strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-10)
    for got, want in zip(momentum, want_delta, strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-10)


def test_shortcut_refuses_gamma_different_from_beta():
    t = [torch.zeros(2)]
    with pytest.raises(ValueError, match="gamma == beta"):
        outer_step_from_fast([torch.zeros(2)], [torch.zeros(2)], t, mean_fast=t,
                             coeffs=OuterCoefficients(0.5, 0.7, 0.0))
    with pytest.raises(ValueError, match="gamma == beta"):
        group_outer_step([torch.zeros(2)], [torch.zeros(2)], t, [PeerOuterState(fast=t)],
                         OuterCoefficients(0.5, 0.7, 0.0))


def _replica_states(seed: int, count: int):
    rng = np.random.default_rng(seed)
    return ([as_torch(random_state(rng)) for _ in range(count)], [as_torch(random_state(rng)) for _ in range(count)],
            [as_torch(random_state(rng)) for _ in range(count)])


@given(seed=st.integers(0, 2**32 - 1), replicas=st.integers(2, 6))
def test_noloco_over_all_replicas_with_gamma_zero_is_diloco(seed, replicas):
    thetas, phis, deltas = _replica_states(seed, replicas)
    alpha, beta = 0.3, 0.7
    # noloco's group machinery with everyone in the group and γ = 0 ...
    group = draw_groups(replicas, "diloco", 2, None)[0]
    assert sorted(group) == list(range(replicas))
    slow_a, mom_a, fast_a = [t.clone() for t in phis[0]], [t.clone() for t in deltas[0]], [t.clone() for t in thetas[0]]
    peers = [PeerOuterState.of(thetas[j], phis[j], theta_only=False) for j in group[1:]]
    group_outer_step(slow_a, mom_a, fast_a, peers, OuterCoefficients(alpha, beta, 0.0))
    # ... equals DiLoCo written directly: δ ← α·δ + β·(all-reduced mean of Δ)
    mean_delta = mean_of([[t - p for t, p in zip(thetas[j], phis[j], strict=True)] for j in range(replicas)])
    for k in range(len(SHAPES)):
        want_mom = alpha * deltas[0][k] + beta * mean_delta[k]
        torch.testing.assert_close(mom_a[k], want_mom, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(slow_a[k], phis[0][k] + want_mom, rtol=1e-12, atol=1e-12)


@given(seed=st.integers(0, 2**32 - 1), gamma=coefficient)
def test_group_of_one_is_local(seed, gamma):
    thetas, phis, deltas = _replica_states(seed, 1)
    alpha, beta = 0.5, 0.7
    slow, mom, fast = [t.clone() for t in phis[0]], [t.clone() for t in deltas[0]], [t.clone() for t in thetas[0]]
    group_outer_step(slow, mom, fast, [], OuterCoefficients(alpha, beta, gamma))
    for k in range(len(SHAPES)):
        # γ has nothing to pull toward: δ ← α·δ + β·(θ_i − φ_i), whatever γ is.
        want = alpha * deltas[0][k] + beta * (thetas[0][k] - phis[0][k])
        torch.testing.assert_close(mom[k], want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(fast[k], phis[0][k] + want, rtol=1e-12, atol=1e-12)


def test_general_outer_step_exact_small_example():
    # One scalar, two members, hand-computed: Δ0 = 1, Δ1 = 3, φ0 = 0, φ1 = 2, δ0 = 1.
    slow, mom, fast = [torch.tensor([0.0])], [torch.tensor([1.0])], [torch.tensor([1.0])]
    outer_step(slow, mom, fast, mean_outer_grad=[torch.tensor([2.0])], mean_slow=[torch.tensor([1.0])],
               coeffs=OuterCoefficients(0.5, 0.25, 0.5))
    # δ = 0.5·1 + 0.25·2 + 0.5·(1 − 0) = 1.5 ; φ = 1.5 ; θ = 1.5
    assert mom[0].item() == 1.5 and slow[0].item() == 1.5 and fast[0].item() == 1.5


def test_mixed_peer_states_are_rejected():
    t = [torch.zeros(2)]
    with pytest.raises(ValueError, match="mix"):
        group_outer_step([torch.zeros(2)], [torch.zeros(2)], [torch.zeros(2)],
                         [PeerOuterState(fast=t), PeerOuterState(slow=t, outer_grad=t)],
                         OuterCoefficients(0.5, 0.7, 0.7))
    with pytest.raises(ValueError):
        PeerOuterState()


def test_method_defaults_follow_the_paper():
    noloco = OuterConfig(method="noloco").resolved()
    assert (noloco.alpha, noloco.beta, noloco.gamma, noloco.h, noloco.group_size) == (0.5, 0.7, 0.7, 50, 2)
    diloco = OuterConfig(method="diloco").resolved()
    assert (diloco.alpha, diloco.beta, diloco.gamma, diloco.h) == (0.3, 0.7, 0.0, 100)
    custom = OuterConfig(method="noloco", beta=0.6, gamma=0.2).resolved()
    assert (custom.beta, custom.gamma) == (0.6, 0.2)


def test_lr_schedule_warmup_then_cosine_to_floor():
    kwargs = dict(lr=1.0, lr_min=0.1, warmup_steps=10, total_steps=110)
    assert lr_at(0, **kwargs) == pytest.approx(0.1)
    assert lr_at(9, **kwargs) == pytest.approx(1.0)
    assert lr_at(10, **kwargs) == pytest.approx(1.0)
    assert lr_at(60, **kwargs) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * 0.5)))
    assert lr_at(110, **kwargs) == pytest.approx(0.1)
    assert lr_at(500, **kwargs) == pytest.approx(0.1)
    values = [lr_at(s, **kwargs) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(values, values[1:], strict=False))


def test_inner_optimizer_clips_and_follows_schedule():
    param = torch.nn.Parameter(torch.zeros(4))
    cfg = OptimConfig(lr=0.1, lr_min=0.01, warmup_steps=2, grad_clip=1.0, weight_decay=0.0)
    inner = InnerOptimizer([param], cfg, total_steps=10)
    param.grad = torch.full((4,), 10.0)  # norm 20, clipped to 1
    norm = inner.step()
    assert norm == pytest.approx(20.0)
    assert param.grad is None
    assert inner.steps_taken == 1
    assert inner.current_lr() == pytest.approx(0.1)
    # Adam's first step moves each coordinate by about lr_0 = 0.05 regardless of scale.
    torch.testing.assert_close(param.detach(), torch.full((4,), -0.05), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("gradient_size", [0.01, 100.0])  # the clip idle, then active
def test_the_mean_and_the_clip_folded_into_the_fused_step_equal_dividing_and_clipping_first(gradient_size):
    """Summed gradients of 4 microbatches stepped with grad_divisor=4: the fused kernel scales
    each gradient as it reads it; the same as dividing, clipping (clip_grad_norm_) and then
    stepping AdamW, as the foreach kernel still does."""
    cfg = OptimConfig(lr=0.01, grad_clip=1.0)
    generator = torch.Generator().manual_seed(0)
    start = [torch.randn(5, 3, generator=generator), torch.randn(7, generator=generator)]
    summed = [[gradient_size * torch.randn(t.shape, generator=generator) for t in start] for _ in range(3)]
    fused = [torch.nn.Parameter(t.clone()) for t in start]
    reference = [torch.nn.Parameter(t.clone()) for t in start]
    inner = InnerOptimizer(fused, cfg, total_steps=10)
    plain = torch.optim.AdamW(reference, lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
                              weight_decay=cfg.weight_decay, foreach=True)
    for step, grads in enumerate(summed):
        for param, grad in zip(fused, grads, strict=True):
            param.grad = grad.clone()
        norm = inner.step(grad_divisor=4.0)
        for param, grad in zip(reference, grads, strict=True):
            param.grad = grad / 4.0
        want = torch.nn.utils.clip_grad_norm_(reference, cfg.grad_clip, foreach=True)
        for group in plain.param_groups:
            group["lr"] = lr_at(step, lr=cfg.lr, lr_min=cfg.lr_min, warmup_steps=inner.warmup_steps,
                                total_steps=10)
        plain.step()
        assert float(norm) == pytest.approx(float(want), rel=1e-6)
    for got, want in zip(fused, reference, strict=True):
        torch.testing.assert_close(got.detach(), want.detach(), rtol=1e-5, atol=1e-7)
    assert not torch.equal(fused[0].detach(), start[0])  # it did step


def test_inner_optimizer_refuses_non_finite_gradients():
    param = torch.nn.Parameter(torch.ones(3))
    inner = InnerOptimizer([param], OptimConfig(), total_steps=10)
    param.grad = torch.tensor([1.0, float("nan"), 0.0])
    inner.step()
    assert torch.equal(param.detach(), torch.ones(3))
    # Skipped on the device: the schedule moves on (as with a gradient scaler), nothing else does.
    assert inner.skipped_nonfinite == 1 and inner.steps_taken == 1 and param.grad is None
    state = inner.optimizer.state[param]
    assert float(state["step"]) == 0.0  # Adam's step count and moments untouched
    assert not state["exp_avg"].any() and not state["exp_avg_sq"].any()
    param.grad = torch.ones(3)  # the next finite step is Adam's first
    inner.step()
    assert inner.skipped_nonfinite == 1 and float(state["step"]) == 1.0
    assert (param.detach() < 1.0).all()


def test_inner_step_reads_nothing_back_from_the_device():
    """The norm stays a tensor and the non-finite check runs on the device: no .item() per step."""
    from noloco_rt.host_reads import HostReadCounter

    param = torch.nn.Parameter(torch.ones(3))
    inner = InnerOptimizer([param], OptimConfig(grad_clip=1.0), total_steps=10)
    with HostReadCounter() as reads:
        for grad in (torch.ones(3), torch.tensor([float("inf"), 0.0, 0.0]), torch.ones(3)):
            param.grad = grad.clone()
            norm = inner.step()
    assert reads.count == 0, reads.ops
    assert isinstance(norm, torch.Tensor)
    with HostReadCounter() as reads:  # the counter does see a read
        float(norm)
    assert reads.count == 1
    assert inner.skipped_nonfinite == 1


def test_warmup_fraction_replaces_warmup_steps():
    param = torch.nn.Parameter(torch.zeros(1))
    cfg = OptimConfig(lr=0.1, lr_min=0.01, warmup_steps=50, warmup_fraction=0.04)
    inner = InnerOptimizer([param], cfg, total_steps=200)  # 4% of 200: 8 warmup steps
    assert inner.warmup_steps == 8
    assert inner.current_lr() == pytest.approx(0.1 / 8)
    assert InnerOptimizer([param], OptimConfig(warmup_steps=50), total_steps=200).warmup_steps == 50


def test_adamw_is_fused_on_cuda_and_the_cpu_and_foreach_elsewhere():
    assert adamw_kernel(torch.device("cuda")) == {"fused": True}
    assert adamw_kernel(torch.device("cpu")) == {"fused": True}
    assert adamw_kernel(torch.device("meta")) == {"foreach": True}
    inner = InnerOptimizer([torch.nn.Parameter(torch.ones(3))], OptimConfig(), total_steps=10)
    assert isinstance(inner.optimizer, FusedAdamW)


def test_kept_gradient_buffers_are_added_to_in_place_and_train_as_fresh_gradients_do():
    """model.cuda_graphs: backward must add each microbatch's gradient into a buffer the
    optimizer owns, never install its own output (a CUDA graph's memory, overwritten at the
    next replay). The buffers stay the same memory across microbatches and steps, are zero
    after each step, and train exactly as gradients made fresh each step do."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    kept = copy.deepcopy(model)
    cfg = OptimConfig(lr=0.01, grad_clip=1.0)
    fresh_inner = InnerOptimizer(model.parameters(), cfg, total_steps=10)
    kept_inner = InnerOptimizer(kept.parameters(), cfg, total_steps=10)
    kept_inner.keep_gradient_buffers()
    buffers = [p.grad.data_ptr() for p in kept.parameters()]
    assert all(not p.grad.any() for p in kept.parameters())
    generator = torch.Generator().manual_seed(1)
    for _ in range(3):
        microbatches = [torch.randn(4, 6, generator=generator) for _ in range(3)]
        for net, inner in ((model, fresh_inner), (kept, kept_inner)):
            for x in microbatches:
                net(x).square().mean().backward()
            inner.step(grad_divisor=len(microbatches))
        assert [p.grad.data_ptr() for p in kept.parameters()] == buffers
        assert all(p.grad is not None and not p.grad.any() for p in kept.parameters())
        assert all(p.grad is None for p in model.parameters())
    for got, want in zip(kept.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(got.detach(), want.detach(), rtol=0, atol=0)
