"""The outer step (docs/architecture.md §1) and the inner optimizer. Pure tensor code, no I/O.

For worker i with fast weights θ_i, slow weights φ_i and outer momentum δ_i, and a
group G that contains i:

    Δ_j  = θ_j − φ_j
    δ_i ← α·δ_i + β·mean_{j∈G} Δ_j + γ·(mean_{j∈G} φ_j − φ_i)
    φ_i ← φ_i + δ_i
    θ_i ← φ_i

noloco: G = i plus random peers, γ = β. diloco: G = all replicas, γ = 0. local: G = {i}.
When γ = β the update is δ_i ← α·δ_i + β·(mean_{j∈G} θ_j − φ_i), so a peer need only
send θ_j; otherwise it sends φ_j and Δ_j. The simulator and the workers call exactly
these functions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from noloco_rt.config import OptimConfig, ResolvedOuter
from noloco_rt.device_check import one_device

TensorList = list[torch.Tensor]


@dataclass(frozen=True)
class OuterCoefficients:
    alpha: float
    beta: float
    gamma: float

    @classmethod
    def from_config(cls, outer: ResolvedOuter) -> OuterCoefficients:
        return cls(alpha=outer.alpha, beta=outer.beta, gamma=outer.gamma)

    @property
    def theta_shortcut(self) -> bool:
        """γ = β: peers need to send only their fast weights θ."""
        return self.gamma == self.beta


@dataclass(frozen=True)
class PeerOuterState:
    """What one group member contributes to an outer step.

    Either `fast` alone (the γ = β shortcut) or both `slow` and `outer_grad`.
    """

    fast: TensorList | None = None
    slow: TensorList | None = None
    outer_grad: TensorList | None = None

    def __post_init__(self) -> None:
        full = self.slow is not None and self.outer_grad is not None
        if not full and self.fast is None:
            raise ValueError("a PeerOuterState needs fast weights, or slow weights and outer gradient")

    @classmethod
    def of(cls, fast: TensorList, slow: TensorList, *, theta_only: bool) -> PeerOuterState:
        """The state a member sends: θ alone when the shortcut applies, else φ and Δ."""
        if theta_only:
            return cls(fast=fast)
        return cls(slow=slow, outer_grad=outer_gradient(fast, slow))


def state_tensors(state: PeerOuterState) -> TensorList:
    """Every tensor a contribution holds (θ, or φ and Δ)."""
    return [*(state.fast or []), *(state.slow or []), *(state.outer_grad or [])]


def outer_gradient(fast: Sequence[torch.Tensor], slow: Sequence[torch.Tensor]) -> TensorList:
    """Δ = θ − φ, tensor by tensor."""
    return [t - s for t, s in zip(fast, slow, strict=True)]


def mean_of(members: Sequence[Sequence[torch.Tensor]]) -> TensorList:
    """Element-wise mean over members, each a list of tensors of identical shapes."""
    if not members:
        raise ValueError("mean over an empty group")
    count = len(members)
    total = [t.clone() for t in members[0]]
    for member in members[1:]:
        if len(member) != len(total):
            raise ValueError(f"group member has {len(member)} tensors, expected {len(total)}")
        torch._foreach_add_(total, list(member))
    torch._foreach_div_(total, float(count))
    return total


@torch.no_grad()
def _apply(slow: TensorList, momentum: TensorList, fast: TensorList, target: TensorList,
           coeffs: OuterCoefficients) -> None:
    """δ ← α·δ + target; φ ← φ + δ; θ ← φ (all in place)."""
    torch._foreach_mul_(momentum, coeffs.alpha)
    torch._foreach_add_(momentum, target)
    torch._foreach_add_(slow, momentum)
    for f, s in zip(fast, slow, strict=True):
        f.copy_(s)


@torch.no_grad()
def outer_step(slow: TensorList, momentum: TensorList, fast: TensorList, *, mean_outer_grad: TensorList,
               mean_slow: TensorList, coeffs: OuterCoefficients) -> None:
    """The general outer step, in place: δ ← α·δ + β·mean Δ + γ·(mean φ − φ_i)."""
    target = [coeffs.beta * d + coeffs.gamma * (m - s)
              for d, m, s in zip(mean_outer_grad, mean_slow, slow, strict=True)]
    _apply(slow, momentum, fast, target, coeffs)


@torch.no_grad()
def outer_step_from_fast(slow: TensorList, momentum: TensorList, fast: TensorList, *, mean_fast: TensorList,
                         coeffs: OuterCoefficients) -> None:
    """The γ = β shortcut, in place: δ ← α·δ + β·(mean θ − φ_i)."""
    if not coeffs.theta_shortcut:
        raise ValueError(f"the fast-weights shortcut needs gamma == beta, got gamma={coeffs.gamma}, beta={coeffs.beta}")
    target = [coeffs.beta * (m - s) for m, s in zip(mean_fast, slow, strict=True)]
    _apply(slow, momentum, fast, target, coeffs)


@torch.no_grad()
def group_outer_step(slow: TensorList, momentum: TensorList, fast: TensorList,
                     peers: Sequence[PeerOuterState], coeffs: OuterCoefficients) -> None:
    """Outer step of worker i with G = {i} ∪ peers, in place. Dispatches to the shortcut
    when every peer sent θ only (which requires γ = β), else to the general formula.
    Our tensors and the peers' must be on one device (ValueError naming both otherwise)."""
    one_device(slow, momentum, fast, *(state_tensors(p) for p in peers), what="group_outer_step")
    if all(p.slow is not None and p.outer_grad is not None for p in peers):
        mean_grad = mean_of([outer_gradient(fast, slow)] + [p.outer_grad for p in peers])  # type: ignore[misc]
        mean_slow = mean_of([slow] + [p.slow for p in peers])  # type: ignore[misc]
        outer_step(slow, momentum, fast, mean_outer_grad=mean_grad, mean_slow=mean_slow, coeffs=coeffs)
        return
    fast_members = [p.fast for p in peers]
    if any(f is None for f in fast_members):
        raise ValueError("peers mix fast-only and slow+gradient states")
    outer_step_from_fast(slow, momentum, fast, mean_fast=mean_of([fast] + fast_members),  # type: ignore[list-item]
                         coeffs=coeffs)


def lr_at(step: int, *, lr: float, lr_min: float, warmup_steps: int, total_steps: int) -> float:
    """Linear warmup from lr/warmup to lr, then cosine decay to lr_min at total_steps."""
    if warmup_steps > 0 and step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return lr_min + 0.5 * (lr - lr_min) * (1 + math.cos(math.pi * progress))


class InnerOptimizer:
    """AdamW on one stage's parameters with the run's schedule and per-stage grad clipping.

    Its state is local to the worker: never averaged, never reset by an outer step.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], cfg: OptimConfig, total_steps: int) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.cfg = cfg
        self.total_steps = total_steps
        self.warmup_steps = cfg.warmup_steps_for(total_steps)
        self.steps_taken = 0
        self.skipped_nonfinite = 0
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
                                           weight_decay=cfg.weight_decay, foreach=True)

    def current_lr(self) -> float:
        return lr_at(self.steps_taken, lr=self.cfg.lr, lr_min=self.cfg.lr_min,
                     warmup_steps=self.warmup_steps, total_steps=self.total_steps)

    def step(self) -> float:
        """Clip, step and clear gradients; returns the grad norm before clipping.

        A non-finite gradient (a poisoned or broken microbatch) is discarded without
        touching weights or optimizer state; it is counted in skipped_nonfinite."""
        if self.cfg.grad_clip > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip, foreach=True))
        else:
            norm = float(torch.linalg.vector_norm(torch.stack(
                [p.grad.norm() for p in self.params if p.grad is not None])))
        if not math.isfinite(norm):
            self.skipped_nonfinite += 1
            self.optimizer.zero_grad(set_to_none=True)
            return norm
        for group in self.optimizer.param_groups:
            group["lr"] = self.current_lr()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps_taken += 1
        return norm

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "steps_taken": self.steps_taken}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps_taken = int(state["steps_taken"])


@torch.no_grad()
def average_gradients(replica_params: Sequence[Sequence[torch.nn.Parameter]], weights: Sequence[float]) -> None:
    """The ddp baseline: every replica's .grad becomes Σ_r w_r·grad_r (replicas without a
    gradient count as zero). Gradients summed over microbatches with w_r = 1/total
    microbatches give the all-reduced mean."""
    count = len(replica_params[0])
    for index in range(count):
        grads = [params[index].grad for params in replica_params]
        reference = next((g for g in grads if g is not None), None)
        if reference is None:
            continue
        total = torch.zeros_like(reference)
        for grad, weight in zip(grads, weights, strict=True):
            if grad is not None and weight != 0:
                total.add_(grad, alpha=weight)
        for params in replica_params:
            params[index].grad = total.clone()
