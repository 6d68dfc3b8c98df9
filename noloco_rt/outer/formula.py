"""The outer step (docs/architecture.md §1). Pure tensor code, no I/O.

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

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from noloco_rt.config import ResolvedOuter
from noloco_rt.outer.device_check import one_device

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

    Either `fast` alone (the γ = β shortcut), both `slow` and `outer_grad`, or `outer_grad`
    alone (a sparse round of noloco_rt.outer.delta_exchange: Δ is averaged, φ is not).
    """

    fast: TensorList | None = None
    slow: TensorList | None = None
    outer_grad: TensorList | None = None

    def __post_init__(self) -> None:
        if self.fast is None and self.outer_grad is None:
            raise ValueError("a PeerOuterState needs fast weights, or slow weights and outer gradient")
        if self.slow is not None and self.outer_grad is None:
            raise ValueError("slow weights travel with their outer gradient")

    @property
    def grad_only(self) -> bool:
        """Δ alone: a sparse round that averages the outer gradient, not φ."""
        return self.fast is None and self.slow is None and self.outer_grad is not None

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
def apply_outer_update(slow: TensorList, momentum: TensorList, fast: TensorList, target: TensorList,
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
    apply_outer_update(slow, momentum, fast, target, coeffs)


@torch.no_grad()
def outer_step_from_fast(slow: TensorList, momentum: TensorList, fast: TensorList, *, mean_fast: TensorList,
                         coeffs: OuterCoefficients) -> None:
    """The γ = β shortcut, in place: δ ← α·δ + β·(mean θ − φ_i)."""
    if not coeffs.theta_shortcut:
        raise ValueError(f"the fast-weights shortcut needs gamma == beta, got gamma={coeffs.gamma}, beta={coeffs.beta}")
    target = [coeffs.beta * (m - s) for m, s in zip(mean_fast, slow, strict=True)]
    apply_outer_update(slow, momentum, fast, target, coeffs)


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
